/**
 * Projection throughput, two parts:
 * - rebuild: fills a scratch store with settled-request events, then drops and replays a ledger
 *   projection (one row per event plus per-stream totals), printing events/s.
 * - metered: the service's own projections (`projections/index.ts`) applying what metered requests
 *   write, as the gateway writes it (per request BudgetReserved + SlotsLeased, then UsageSettled +
 *   SlotsLeased, on 16 keys' meter streams), in batches of BENCH_BATCH events (default 200: what the
 *   live runner's 50 ms gather brings at 1,000 requests/s). It prints the CPU per event and per
 *   request of this process and, on PostgreSQL, of the database's own server processes (a scratch
 *   database, so other clients' work is not counted), rounds of each.
 * PGlite always (in memory); PostgreSQL when DATABASE_URL is set.
 *   node --import tsx bench/projections.ts [events, default 200000]
 * BENCH_PARTS=rebuild,metered and BENCH_STORES=pglite,postgres pick parts; BENCH_REQUESTS (default 10000) and BENCH_ROUNDS (default 3) size the metered part.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import pg from 'pg';
import { ProjectionRunner } from '../src/processors/index.ts';
import { openEventStore, type EventStore } from '../src/store/index.ts';
import { projections } from '../projections/index.ts';
import { meterStream } from '../events/meter.ts';
import { ledgerProjection } from '../test/processors/fixtures.ts';
import { scratchDatabase } from '../test/support/postgres.ts';

const total = Number(process.argv[2] ?? process.env.BENCH_EVENTS ?? 200_000);
const parts = new Set((process.env.BENCH_PARTS ?? 'rebuild,metered').split(','));
const requests = Number(process.env.BENCH_REQUESTS ?? 10_000);
const rounds = Number(process.env.BENCH_ROUNDS ?? 3);
const batchSize = Number(process.env.BENCH_BATCH ?? 200);
const url = process.env.DATABASE_URL;
const stores = new Set((process.env.BENCH_STORES ?? 'pglite,postgres').split(','));

async function fill(store: EventStore): Promise<void> {
  const streams = 1000;
  const perAppend = 50;
  let written = 0;
  const versions = new Map<string, number>();
  const ids = Array.from({ length: streams }, () => `meter-${randomUUID()}`);
  while (written < total) {
    const round: Promise<unknown>[] = [];
    for (let s = 0; s < 64 && written < total; s++, written += perAppend) {
      const stream = ids[(written / perAppend) % streams];
      const version = versions.get(stream) ?? 0;
      versions.set(stream, version + perAppend);
      const events = Array.from({ length: perAppend }, (_, i) => ({
        id: randomUUID(),
        type: 'RequestSettled',
        data: { tokens: (written + i) % 500, model: 'ref-byte', status: 200, latency_ms: 812 },
        metadata: { request_id: randomUUID() },
      }));
      round.push(store.append(stream, events, version));
    }
    await Promise.all(round);
  }
}

async function rebuild(label: string, store: EventStore, done: () => Promise<void>): Promise<void> {
  try {
    await fill(store);
    const runner = new ProjectionRunner({ store, projections: [ledgerProjection] });
    const report = await runner.rebuild(ledgerProjection.name);
    console.log(
      `projections ${label.padEnd(8)} rebuild: ${report.events.toLocaleString('en-US')} events in ${report.seconds.toFixed(2)} s = ${Math.round(report.eventsPerSecond).toLocaleString('en-US')} events/s`,
    );
  } finally {
    await store.close();
    await done();
  }
}

/** A metered request's four events as the gateway appends them: the reservation with its slot lease, the settlement with the lease shrunk. */
function meteredRequest(keyId: string, n: number, at: Date): { reserve: NewEvents; settle: NewEvents } {
  const requestId = `req_${keyId}_${n}`;
  const iso = at.toISOString();
  const expires = new Date(at.getTime() + 60_000).toISOString();
  const facts = { request_id: requestId, key_prefix: keyId, email: `${keyId}@bench.invalid`, client_ip: '127.0.0.1', endpoint: '/v1/completions', model: 'instant', user: null, workload: null };
  const metadata = (version: number, command: string) => ({ origin: holder, command_id: `${command}:${requestId}`, request_id: requestId, schema_version: version });
  const lease = (slots: number, command: string) => ({ id: randomUUID(), type: 'SlotsLeased', data: { holder, slots, expires_at: expires, at: iso }, metadata: metadata(1, command) });
  return {
    reserve: [
      {
        id: randomUUID(),
        type: 'BudgetReserved',
        data: {
          ...facts,
          input_tokens: 20,
          output_tokens: 16,
          max_tokens_requested: 16,
          max_tokens_applied: 16,
          choices: 1,
          clamped_by: null,
          at: iso,
          expires_at: expires,
          lease_holder: holder,
          budgets: { monthly_token_budget: null, daily_token_budget: null, monthly_input_token_budget: null, monthly_output_token_budget: null },
          limits: { max_active: 16, per_minute: 600, max_queued: 64 },
        },
        metadata: metadata(3, 'reserve'),
      },
      lease(2, 'reserve'),
    ],
    settle: [
      {
        id: randomUUID(),
        type: 'UsageSettled',
        data: {
          ...facts,
          input_tokens: 20,
          output_tokens: 16,
          status: 200,
          latency_ms: 1.25 + (n % 7) / 8,
          gpu_seconds: 0.001 + (n % 5) / 1000,
          disconnected: false,
          at: iso,
          cost_micros: 1 + (n % 5),
          price_per_gpu_second_micros: 1000,
          basis: 'engine_usage',
          generated_output_tokens: null,
          relayed_output_tokens: null,
        },
        metadata: metadata(3, 'settle'),
      },
      lease(1, 'settle'),
    ],
  };
}
type NewEvents = Parameters<EventStore['append']>[1];
const holder = randomUUID();

/** Appends `count` metered requests over 16 keys, 64 at a time, each request's two appends in order. */
async function fillMetered(store: EventStore, from: number, count: number): Promise<void> {
  const keys = Array.from({ length: 16 }, () => randomBytes(6).toString('hex'));
  const day = new Date().toISOString().slice(0, 10);
  for (let n = from; n < from + count; n += 64) {
    await Promise.all(
      Array.from({ length: Math.min(64, from + count - n) }, async (_, i) => {
        const keyId = keys[(n + i) % keys.length];
        const { reserve, settle } = meteredRequest(keyId, n + i, new Date());
        await store.append(meterStream(keyId, day), reserve, 'any');
        await store.append(meterStream(keyId, day), settle, 'any');
      }),
    );
  }
}

/** CPU seconds (user + system) of a process so far; null when it cannot be read (not on this machine). */
function cpuSecondsOf(pid: number): number | null {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return null;
  }
}

/** CPU seconds the backends used between two readings; one the pool opened meanwhile counts from zero (one it closed is lost: rare, the pool keeps them while busy). */
function serverSeconds(before: Map<number, number>, after: Map<number, number>): number {
  return [...after].reduce((sum, [pid, seconds]) => sum + seconds - (before.get(pid) ?? 0), 0);
}

async function metered(label: string, open: () => Promise<{ store: EventStore; serverCpu(): Promise<Map<number, number> | null>; done(): Promise<void> }>): Promise<void> {
  const { store, serverCpu, done } = await open();
  try {
    // Tables and checkpoints made once, outside the figures.
    const first = new ProjectionRunner({ store, projections, batchSize });
    await first.start();
    await first.stop();
    // What a runner's start costs with nothing to apply (its tables' DDL, leases): taken off each round's figure.
    const idle = new ProjectionRunner({ store, projections, batchSize });
    const [idleCpu, idleServer] = [process.cpuUsage(), await serverCpu()];
    await idle.start();
    await idle.caughtUp();
    const idleUsed = process.cpuUsage(idleCpu);
    const idleServerAfter = await serverCpu();
    await idle.stop();
    const fixed = { node: idleUsed.user + idleUsed.system, server: idleServer && idleServerAfter ? serverSeconds(idleServer, idleServerAfter) * 1e6 : 0 };
    const perEvent: { node: number; server: number | null }[] = [];
    for (let round = 0; round < rounds; round++) {
      await fillMetered(store, round * requests, requests);
      const runner = new ProjectionRunner({ store, projections, batchSize });
      const [cpu, server, started] = [process.cpuUsage(), await serverCpu(), performance.now()];
      await runner.start();
      await runner.caughtUp();
      const seconds = (performance.now() - started) / 1000;
      const used = process.cpuUsage(cpu);
      const serverAfter = await serverCpu();
      await runner.stop();
      const events = requests * 4;
      const node = Math.max(0, used.user + used.system - fixed.node) / events;
      const pgUs = server === null || serverAfter === null ? null : Math.max(0, serverSeconds(server, serverAfter) * 1e6 - fixed.server) / events;
      perEvent.push({ node, server: pgUs });
      console.log(
        `projections ${label.padEnd(8)} metered round ${round + 1}: ${events.toLocaleString('en-US')} events (${requests.toLocaleString('en-US')} requests) in ${seconds.toFixed(2)} s = ${Math.round(events / seconds).toLocaleString('en-US')} events/s; ` +
          `CPU per event: this process ${node.toFixed(1)} µs${pgUs === null ? '' : `, PostgreSQL ${pgUs.toFixed(1)} µs`} (per request x4)`,
      );
    }
    const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
    const nodeMedian = median(perEvent.map((p) => p.node));
    const serverMedian = perEvent.every((p) => p.server !== null) ? median(perEvent.map((p) => p.server!)) : null;
    console.log(
      `projections ${label.padEnd(8)} metered, median of ${rounds}, batches of ${batchSize} (a start with nothing to apply, taken off: ${(fixed.node / 1000).toFixed(0)} ms here, ${(fixed.server / 1000).toFixed(0)} ms PostgreSQL): CPU per event ${nodeMedian.toFixed(1)} µs in this process${serverMedian === null ? '' : `, ${serverMedian.toFixed(1)} µs in PostgreSQL`}; ` +
        `per metered request (4 events) ${Math.round(nodeMedian * 4)} µs${serverMedian === null ? '' : ` and ${Math.round(serverMedian * 4)} µs`}`,
    );
  } finally {
    await store.close();
    await done();
  }
}

if (parts.has('rebuild')) {
  await rebuild('pglite', await openEventStore({ inMemory: true }), async () => {});
  if (url) {
    const schema = `bench_${randomBytes(4).toString('hex')}`;
    await rebuild('postgres', await openEventStore({ databaseUrl: url, schema }), async () => {
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      await client.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
      await client.end();
    });
  } else {
    console.log('projections postgres: skipped (set DATABASE_URL)');
  }
}

if (parts.has('metered')) {
  if (stores.has('pglite')) await metered('pglite', async () => ({ store: await openEventStore({ inMemory: true }), serverCpu: async () => null, done: async () => {} }));
  if (url && stores.has('postgres')) {
    await metered('postgres', async () => {
      const db = await scratchDatabase(url, 'bench_projections');
      const store = await openEventStore({ databaseUrl: db.url });
      const watcher = new pg.Client({ connectionString: url });
      await watcher.connect();
      const name = new URL(db.url).pathname.slice(1);
      return {
        store,
        // The scratch database's backends (the store's pool): their CPU is the projections' and the appends'; only the projections run while measured.
        async serverCpu() {
          const { rows } = await watcher.query<{ pid: number }>('SELECT pid FROM pg_stat_activity WHERE datname = $1', [name]);
          const used = new Map<number, number>();
          for (const { pid } of rows) {
            const seconds = cpuSecondsOf(pid);
            if (seconds === null) return null;
            used.set(pid, seconds);
          }
          return used;
        },
        async done() {
          await watcher.end();
          await db.drop();
        },
      };
    });
  }
}
