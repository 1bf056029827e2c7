/**
 * The PostgreSQL transport against the dispatch contract, on PGlite always (two transports over one
 * embedded store) and on PostgreSQL when DATABASE_URL is set (two stores, so two connection pools,
 * woken through NOTIFY); then what only a database can show: a consumer process killed with SIGKILL,
 * two consumer processes sharing a queue, a lease taken over.
 *
 * Run with `--consumer URL SCHEMA KIND MODE CONCURRENCY`, this file is that consumer process instead.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { DispatchLeaseLost, postgresTransport, type DispatchMessage, type DispatchTransport } from '../../src/dispatch/index.ts';
import { internalTable, openEventStore, type EventStore } from '../../src/store/index.ts';
import { until } from '../support/until.ts';
import { within } from '../support/within.ts';
import { abortedOrGiveUp, transportContract, type ContractTiming } from './transport-contract.ts';

const waitLimitMs = 10_000;
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const waitFor = <T>(what: string, probe: () => T | null | undefined | false) => until(what, async () => probe(), waitLimitMs, 5);

const consumerFlag = process.argv.indexOf('--consumer');
if (consumerFlag >= 0) await runConsumerProcess(process.argv.slice(consumerFlag + 1));
else runSuites();

/**
 * The consumer process: prints `{"ready":true}` once consuming, then one JSON line per delivery.
 * MODE `hang`: handlers never finish (the process is killed); `work`: each takes 3 ms; on stdin's
 * end the process stops its consumer, closes and exits.
 */
async function runConsumerProcess([url, schema, kind, mode, concurrency]: string[]): Promise<void> {
  const store = await openEventStore({ databaseUrl: url, schema });
  const transport = postgresTransport(store, { listenUrl: url, visibilityTimeoutMs: 500, pollIntervalMs: 60_000 });
  await transport.ready();
  const consumer = transport.consume(
    kind,
    async (message) => {
      process.stdout.write(`${JSON.stringify({ key: message.key, deliveries: message.deliveries })}\n`);
      await (mode === 'hang' ? new Promise(() => {}) : sleep(3));
    },
    { concurrency: Number(concurrency) },
  );
  process.stdout.write(`${JSON.stringify({ ready: true })}\n`);
  process.stdin.resume();
  process.stdin.on('end', async () => {
    await consumer.stop();
    await transport.close();
    await store.close();
    process.exit(0);
  });
}

interface ConsumerProcess {
  child: ChildProcess;
  lines: Array<{ key?: string; deliveries?: number; ready?: boolean }>;
  exited: Promise<void>;
}

function startConsumerProcess(url: string, schema: string, kind: string, mode: 'hang' | 'work', concurrency: number): ConsumerProcess {
  const self = fileURLToPath(import.meta.url);
  const child = spawn(process.execPath, ['--import', 'tsx', self, '--consumer', url, schema, kind, mode, String(concurrency)], { stdio: ['pipe', 'pipe', 'inherit'] });
  const lines: ConsumerProcess['lines'] = [];
  createInterface({ input: child.stdout! }).on('line', (line) => lines.push(JSON.parse(line)));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  return { child, lines, exited };
}

function runSuites(): void {
  const url = process.env.DATABASE_URL;
  if (!url) console.log('postgres dispatch: PostgreSQL skipped, with its PostgreSQL-only tests (set DATABASE_URL to run them)');
  const schema = `test_${randomBytes(6).toString('hex')}`;

  // PGlite: two transports over one embedded store (one process, one connection)
  let embedded: EventStore;
  transportContract({
    name: 'postgres transport on pglite',
    async setup() {
      embedded = await openEventStore({ inMemory: true });
    },
    async pair(timing: ContractTiming) {
      return [postgresTransport(embedded, timing), postgresTransport(embedded, timing)];
    },
    async teardown() {
      await embedded?.close();
    },
  });

  if (url) {
    // PostgreSQL: two stores, so a consumer on the one hears the other's publishes only through NOTIFY
    let stores: EventStore[] = [];
    transportContract({
      name: 'postgres transport on postgresql',
      async setup() {
        stores = [await openEventStore({ databaseUrl: url, schema }), await openEventStore({ databaseUrl: url, schema })];
      },
      async pair(timing: ContractTiming) {
        return [postgresTransport(stores[0], { ...timing, listenUrl: url }), postgresTransport(stores[1], { ...timing, listenUrl: url })];
      },
      async teardown() {
        await Promise.all(stores.map((s) => s.close()));
      },
    });
  }

  const adapters: Array<{ name: string; open(): Promise<EventStore> }> = [{ name: 'pglite', open: () => openEventStore({ inMemory: true }) }];
  if (url) adapters.push({ name: 'postgresql', open: () => openEventStore({ databaseUrl: url, schema }) });

  for (const adapter of adapters) {
    const it = suite<{ store: EventStore; transports: DispatchTransport[] }>(`postgres dispatch transport (${adapter.name})`);
    it.before(async (context) => {
      context.store = await adapter.open();
    });
    it.before.each((context) => {
      context.transports = [];
    });
    it.after.each(async (context) => {
      await Promise.all(context.transports.map((t) => within(waitLimitMs, t.close(), 'a transport closes after a test')));
    });
    it.after(async (context) => {
      await context.store?.close();
    });

    it('its table lives in the store\'s internal schema, out of the analysts\' one', async (context) => {
      const transport = postgresTransport(context.store);
      context.transports.push(transport);
      await transport.ready();
      const { rows } = await context.store.query<{ t: string | null }>(`SELECT to_regclass($1)::text AS t`, [internalTable(context.store, 'dispatch_messages')]);
      assert.ok(rows[0].t, 'created by ready()');
      const { rows: outside } = await context.store.query<{ t: string | null }>(`SELECT to_regclass('dispatch_messages')::text AS t`);
      assert.is(outside[0].t, null);
    });

    it('a handler whose lease another consumer took is aborted with DispatchLeaseLost, and its throw leaves the message to that consumer', async (context) => {
      const transport = postgresTransport(context.store, { visibilityTimeoutMs: 300, pollIntervalMs: 60_000, retryBackoffMs: 60_000 });
      context.transports.push(transport);
      const kind = `lease-${randomUUID().slice(0, 8)}`;
      let reason: unknown = null;
      let started = false;
      transport.consume(kind, async (_message, signal) => {
        started = true;
        signal.addEventListener('abort', () => (reason = signal.reason));
        await abortedOrGiveUp(signal);
      });
      await transport.publish(kind, 'taken', {});
      await waitFor('the handler running', () => started);
      const table = internalTable(context.store, 'dispatch_messages');
      const thief = randomUUID();
      await context.store.query(`UPDATE ${table} SET claim = $2::uuid WHERE kind = $1`, [kind, thief]);
      await waitFor('the abort', () => reason !== null);
      assert.instance(reason, DispatchLeaseLost);
      await sleep(50);
      const { rows } = await context.store.query<{ claim: string }>(`SELECT claim::text AS claim FROM ${table} WHERE kind = $1`, [kind]);
      assert.equal(rows, [{ claim: thief }], 'still the other consumer\'s');
    });

    it('a claim that comes back after its visibility lapsed, another consumer holding the message by then, is never handled', async (context) => {
      const visibilityTimeoutMs = 300;
      const table = internalTable(context.store, 'dispatch_messages');
      const kind = `late-${randomUUID().slice(0, 8)}`;
      const thief = randomUUID();
      let delayed = false;
      // The store as a busy process sees it: the claim's answer arrives after its visibility lapsed, and
      // another consumer claimed the message meanwhile.
      const slow = new Proxy(context.store, {
        get(target, property) {
          const value = Reflect.get(target, property, target);
          if (property !== 'query') return typeof value === 'function' ? value.bind(target) : value;
          return async (sql: string, params?: unknown[]) => {
            const result = await target.query(sql, params as never);
            if (!delayed && sql.includes('SKIP LOCKED') && params?.[0] === kind && result.rows.some((r) => r.id !== null)) {
              delayed = true;
              await sleep(visibilityTimeoutMs + 100);
              await target.query(`UPDATE ${table} SET claim = $2::uuid, visible_at = now() + interval '1 minute' WHERE kind = $1`, [kind, thief]);
            }
            return result;
          };
        },
      });
      const transport = postgresTransport(slow, { visibilityTimeoutMs, pollIntervalMs: 60_000 });
      context.transports.push(transport);
      const handled: DispatchMessage[] = [];
      transport.consume(kind, async (m) => void handled.push(m));
      await transport.publish(kind, 'late', {});
      await waitFor('the late claim', () => delayed);
      await sleep(visibilityTimeoutMs * 3);
      assert.equal(handled, [], 'the lapsed claim was dropped, not handled beside the other consumer');
      const { rows } = await context.store.query<{ claim: string }>(`SELECT claim::text AS claim FROM ${table} WHERE kind = $1`, [kind]);
      assert.equal(rows, [{ claim: thief }], 'still the other consumer\'s');
    });

    if (adapter.name === 'postgresql') {
      it('an idle consumer without a LISTEN connection gets another connection\'s publish at its poll', async (context) => {
        const other = await openEventStore({ databaseUrl: url!, schema });
        try {
          const publisher = postgresTransport(context.store);
          const polling = postgresTransport(other, { pollIntervalMs: 200 });
          context.transports.push(publisher, polling);
          const kind = `poll-${randomUUID().slice(0, 8)}`;
          const got: string[] = [];
          polling.consume(kind, async (m) => void got.push(m.key));
          await polling.ready();
          await publisher.publish(kind, 'x', {});
          await within(3_000, waitFor('the polled delivery', () => got.length === 1), 'a poll every 200 ms');
          await polling.close();
        } finally {
          await other.close();
        }
      });

      it('a consumer process killed with SIGKILL: its heartbeat held the message, then another consumer gets it after the visibility timeout', async (context) => {
        const kind = `killed-${randomUUID().slice(0, 8)}`;
        const victim = startConsumerProcess(url!, schema, kind, 'hang', 1);
        try {
          await waitFor('the consumer process ready', () => victim.lines.some((l) => l.ready));
          const transport = postgresTransport(context.store, { listenUrl: url, visibilityTimeoutMs: 500, pollIntervalMs: 60_000 });
          context.transports.push(transport);
          await transport.publish(kind, 'job', { n: 1 });
          await waitFor('the consumer process has it', () => victim.lines.some((l) => l.key === 'job'));
          const got: Array<DispatchMessage & { at: number }> = [];
          transport.consume(kind, async (m) => void got.push({ ...m, at: performance.now() }));
          await sleep(1_500); // three visibility timeouts: its heartbeat keeps it from us
          assert.equal(got, []);
          victim.child.kill('SIGKILL');
          await victim.exited;
          const killedAt = performance.now();
          await waitFor('the message redelivered', () => got.length === 1);
          assert.is(got[0].key, 'job');
          assert.is(got[0].deliveries, 2);
          assert.equal(got[0].payload, { n: 1 });
          // the lease it held ran out, at most 500 ms after its last heartbeat
          assert.ok(got[0].at - killedAt < 2_000, `redelivered ${Math.round(got[0].at - killedAt)} ms after the kill`);
        } finally {
          victim.child.kill('SIGKILL');
          await victim.exited;
        }
      });

      it('two consumer processes on one queue: every message handled once, none by both', async (context) => {
        const kind = `shared-${randomUUID().slice(0, 8)}`;
        const peer = startConsumerProcess(url!, schema, kind, 'work', 3);
        try {
          await waitFor('the consumer process ready', () => peer.lines.some((l) => l.ready));
          const transport = postgresTransport(context.store, { listenUrl: url, visibilityTimeoutMs: 500, pollIntervalMs: 60_000 });
          context.transports.push(transport);
          const mine: Array<{ key: string; deliveries: number }> = [];
          transport.consume(kind, async (m) => {
            await sleep(3);
            mine.push({ key: m.key, deliveries: m.deliveries });
          }, { concurrency: 3 });
          const count = 60;
          for (let i = 0; i < count; i++) await transport.publish(kind, `m${i}`, {});
          const theirs = () => peer.lines.filter((l) => l.key) as Array<{ key: string; deliveries: number }>;
          await waitFor('every message handled', () => mine.length + theirs().length >= count);
          peer.child.stdin!.end();
          await within(waitLimitMs, peer.exited, 'the consumer process exits');
          await sleep(50);
          const all = [...mine, ...theirs()];
          assert.is(all.length, count, 'each once');
          assert.is(new Set(all.map((h) => h.key)).size, count);
          assert.ok(all.every((h) => h.deliveries === 1), 'never redelivered');
          console.log(`  two processes: ${mine.length} here, ${theirs().length} in the other`);
        } finally {
          peer.child.kill('SIGKILL');
          await peer.exited;
        }
      });
    }

    it.run();
  }

  if (url) {
    const cleanup = suite('postgres dispatch: cleanup');
    cleanup('drops the test schema', async () => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      await client.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await client.query(`DROP SCHEMA IF EXISTS "${schema}_internal" CASCADE`);
      await client.end();
    });
    cleanup.run();
  }
}
