/**
 * Timers on a real store: a workflow schedules an input for later, and the workflow processor gives it
 * once when due. PGlite always and PostgreSQL when DATABASE_URL is set: a timer fires when due and
 * never again, and a processor that dies before its commit leaves it to the next, which fires it once.
 * PostgreSQL only (real processes): the process holding the lease is killed with SIGKILL while a
 * timer is scheduled, and another process fires it once; two live processes fire each timer once.
 *
 * Run with `--child URL SCHEMA`, this file is such a process instead: it drives the pings workflow
 * (lease 1 s), prints `{"holder":...}` once started, then `{"fired":id}` for each command it sends.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { defineEvent, eventCatalogue, scheduleInput, Type, workflowStream, type Decider, type EventOf, type Workflow, type WorkflowCommand } from '../../src/event-sourcing/index.ts';
import { sqlLeases, WorkflowProcessor, type ProcessorSources } from '../../src/processors/index.ts';
import { openEventStore, type EventStore } from '../../src/store/index.ts';
import { adaptersUnderTest } from '../store/adapters.ts';
import { until } from '../support/until.ts';
import { countingQueries } from '../support/counting-queries.ts';

const PingRequested = defineEvent('PingRequested', Type.Object({ ping_id: Type.String(), at: Type.String() }, { additionalProperties: false }));
const PingDue = defineEvent('PingDue', Type.Object({ ping_id: Type.String() }, { additionalProperties: false }));
const Pinged = defineEvent('Pinged', Type.Object({ ping_id: Type.String() }, { additionalProperties: false }));
type PingInput = EventOf<typeof PingRequested> | EventOf<typeof PingDue>;
type Ping = { type: 'Ping'; pingId: string };

const pingedDecider: Decider<null, Ping, EventOf<typeof Pinged>> = {
  events: eventCatalogue('pinged', [Pinged]),
  initialState: () => null,
  evolve: (state) => state,
  decide: (command) => [Pinged({ ping_id: command.pingId })],
};

/** A ping requested for time T is scheduled at T; when it fires, one Ping goes to its stream. */
const pingsWorkflow: Workflow<PingInput, null, Ping> = {
  name: 'pings',
  inputs: eventCatalogue('pings', [PingRequested, PingDue]),
  inputTypes: ['PingRequested'],
  scheduledTypes: ['PingDue'],
  target: pingedDecider,
  instanceOf: (input) => input.data.ping_id,
  initialState: () => null,
  decide(input) {
    const id = input.data.ping_id;
    if (input.type === 'PingRequested') return [scheduleInput(input.data.at, `ping:${id}`, PingDue({ ping_id: id }))];
    return [{ stream: `pinged-${id}`, commandId: `ping:${id}`, command: { type: 'Ping', pingId: id } }];
  },
  evolve: (state) => state,
};

/** A processor of the pings workflow whose commands are counted (`fired`) on their way to the handler. */
function pingProcessor(sources: ProcessorSources, store: EventStore, options: { now?: () => Date; leaseMs?: number; onFired?: (id: string) => void } = {}) {
  const handler = new CommandHandler({ store });
  const fired: string[] = [];
  const errors: unknown[] = [];
  const deliver = async ({ stream, command, commandId }: WorkflowCommand<Ping>) => {
    fired.push(command.pingId);
    options.onFired?.(command.pingId);
    await handler.handle(stream, command, pingedDecider, { commandId });
  };
  const processor = new WorkflowProcessor({
    ...sources,
    handler,
    workflows: [pingsWorkflow],
    deliver: { pings: deliver },
    now: options.now,
    leaseMs: options.leaseMs,
    idleCheckpointMs: 50,
    pollIntervalMs: 50,
    onError: (_w, e) => errors.push(e),
  });
  return { processor, fired, errors };
}

const request = (store: EventStore, pingId: string, at: Date) => store.append(`requests-${pingId}`, [{ id: randomUUID(), type: 'PingRequested', data: { ping_id: pingId, at: at.toISOString() } }], 'any');
const typesOf = async (store: EventStore, stream: string) => (await store.readStream(stream)).events.map((e) => e.type);
const firings = async (store: EventStore, pingId: string) => (await store.readStream(workflowStream('pings', pingId))).events.filter((e) => e.type === 'WorkflowInputRecorded' && (e.data as { event_id: string }).event_id === `ping:${pingId}`).length;
const settle = () => new Promise((resolve) => setTimeout(resolve, 300)); // several idle rounds (50 ms each)

const childFlag = process.argv.indexOf('--child');
if (childFlag >= 0) await runChild(process.argv.slice(childFlag + 1));
else runSuites();

async function runChild([url, schema]: string[]): Promise<void> {
  const store = await openEventStore({ databaseUrl: url, schema });
  const { processor } = pingProcessor({ store }, store, { leaseMs: 1000, onFired: (id) => process.stdout.write(`${JSON.stringify({ fired: id })}\n`) });
  await processor.start();
  process.stdout.write(`${JSON.stringify({ holder: processor.leaseHolder })}\n`);
  process.stdin.resume();
  process.stdin.on('end', async () => {
    await processor.stop();
    await store.close();
    process.exit(0);
  });
}

interface Child {
  child: ChildProcess;
  lines: Array<{ holder?: string; fired?: string }>;
  exited: Promise<void>;
}

function startChild(url: string, schema: string): Child {
  const child = spawn(process.execPath, ['--import', 'tsx', fileURLToPath(import.meta.url), '--child', url, schema], { stdio: ['pipe', 'pipe', 'inherit'] });
  const lines: Child['lines'] = [];
  createInterface({ input: child.stdout! }).on('line', (line) => lines.push(JSON.parse(line)));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  return { child, lines, exited };
}

/** A processor on a moved clock (12:00:00) with one ping requested for 12:00:30, caught up: its timer pending. */
async function pendingPing(store: EventStore) {
  const clock = { now: new Date('2026-11-26T12:00:00Z') };
  const { processor, fired, errors } = pingProcessor({ store }, store, { now: () => clock.now });
  await processor.start();
  const id = randomBytes(4).toString('hex');
  await request(store, id, new Date('2026-11-26T12:00:30Z'));
  await processor.caughtUp();
  await settle();
  return { clock, processor, fired, errors, id };
}

function runSuites(): void {
  for (const adapter of adaptersUnderTest()) {
    const it = suite<{ store: EventStore }>(`workflow timers (${adapter.name})`);
    it.before(async (context) => {
      context.store = await adapter.open({ pollIntervalMs: 50 });
    });
    it.after(async (context) => {
      await context.store?.close();
      await adapter.cleanup();
    });

    it('a scheduled input fires when due, not before, once, and is recorded on its instance with what it caused', async ({ store }) => {
      const { clock, processor, fired, errors, id } = await pendingPing(store);
      assert.equal(fired, [], 'not due yet');
      assert.equal(await typesOf(store, workflowStream('pings', id)), ['WorkflowInputRecorded', 'WorkflowInputScheduled']);
      clock.now = new Date('2026-11-26T12:00:30Z');
      await until('the timer firing', async () => fired.length > 0, 10_000, 20);
      clock.now = new Date('2026-11-26T12:05:00Z');
      await settle();
      assert.equal(fired, [id], 'fired once');
      assert.equal(await typesOf(store, `pinged-${id}`), ['Pinged']);
      const recorded = (await store.readStream(workflowStream('pings', id))).events;
      assert.equal(recorded.map((e) => e.type), ['WorkflowInputRecorded', 'WorkflowInputScheduled', 'WorkflowInputRecorded', 'WorkflowCommandSent']);
      assert.is((recorded[2].data as { fired_at?: string }).fired_at, '2026-11-26T12:00:30.000Z');
      await processor.stop();
      assert.equal(errors, []);
    });

    it('an idle round with a timer pending asks the database once for what is due and when to look again', async ({ store }) => {
      const { clock, processor, fired, errors, id } = await pendingPing(store);
      const isDue = (sql: string) => sql.includes('workflow_timers') && sql.includes('due_at <=');
      const isNext = (sql: string) => sql.includes('min(due_at) AS due_at');
      try {
        const idle = await countingQueries(async (sent) => {
          await until('idle rounds', async () => sent.filter(isDue).length >= 5, 10_000, 20);
          return [...sent];
        });
        assert.is(idle.filter(isNext).length, 0, 'no second query for the next timer');
        clock.now = new Date('2026-11-26T12:00:30Z');
        await until('the timer firing', async () => fired.length > 0, 10_000, 20);
        assert.equal(fired, [id]);
      } finally {
        await processor.stop();
      }
      assert.equal(errors, []);
    });

    it('a processor that dies after sending a timer’s command, before its commit: the next one fires it, recorded once, its command appending once', async ({ store }) => {
      const id = randomBytes(4).toString('hex');
      await request(store, id, new Date(Date.now() + 200));
      const crashing = new Proxy(store, {
        get(target, property, receiver) {
          // The commit that would record the firing never happens: the process dies first.
          if (property === 'transaction') return (fn: Parameters<EventStore['transaction']>[0]) => (first.fired.length > 0 ? Promise.reject(new Error('killed before the commit')) : target.transaction(fn));
          const value = Reflect.get(target, property, receiver);
          return typeof value === 'function' ? value.bind(target) : value;
        },
      }) as EventStore;
      const first = pingProcessor({ store: crashing, leases: false } as ProcessorSources, store);
      await first.processor.start();
      await until('the first processor sending the command', async () => first.fired.length > 0, 10_000, 20);
      await first.processor.stop();
      assert.is(await firings(store, id), 0, 'nothing recorded by the dead one');
      const second = pingProcessor({ store, leases: false } as ProcessorSources, store);
      await second.processor.start();
      await until('the second processor firing it', async () => (await firings(store, id)) === 1, 10_000, 20);
      await settle();
      assert.is(await firings(store, id), 1, 'recorded fired once');
      assert.equal(second.fired, [id], 'the next process sent it again');
      assert.equal(await typesOf(store, `pinged-${id}`), ['Pinged'], 'its command appended once');
      await second.processor.stop();
    });

    it.run();
  }

  const apart = suite('workflow timers, the log apart from the database (two PGlite stores)');
  apart('a crash between the records on the log and the index in the database loses no timer and doubles none', async () => {
    const log = await openEventStore({ inMemory: true, pollIntervalMs: 50 });
    const db = await openEventStore({ inMemory: true });
    try {
      const id = randomBytes(4).toString('hex');
      await request(log, id, new Date(Date.now() + 300));
      // The first process appends its records to the log, then dies before every database transaction (index, checkpoint).
      const dying = new Proxy(db, {
        get(target, property, receiver) {
          if (property === 'transaction') return () => Promise.reject(new Error('killed before the commit'));
          const value = Reflect.get(target, property, receiver);
          return typeof value === 'function' ? value.bind(target) : value;
        },
      }) as EventStore;
      const first = pingProcessor({ log, db: dying }, log);
      await first.processor.start();
      await until('the first recording the schedule on the log', async () => (await typesOf(log, workflowStream('pings', id))).includes('WorkflowInputScheduled'), 10_000, 20);
      await first.processor.stop();
      const second = pingProcessor({ log, db }, log);
      await second.processor.start();
      await until('the second firing the timer', async () => second.fired.length > 0, 10_000, 20);
      await settle();
      assert.equal(second.fired, [id], 'fired once');
      assert.is(await firings(log, id), 1);
      assert.equal(await typesOf(log, workflowStream('pings', id)), ['WorkflowInputRecorded', 'WorkflowInputScheduled', 'WorkflowInputRecorded', 'WorkflowCommandSent'], 'the request recorded once');
      await second.processor.stop();
    } finally {
      await log.close();
      await db.close();
    }
  });
  apart.run();

  const url = process.env.DATABASE_URL;
  if (!url) return;
  const schema = `test_${randomBytes(6).toString('hex')}`;
  const pg = suite<{ store: EventStore; children: Child[] }>('workflow timers across processes (postgres)');
  pg.before(async (context) => {
    context.store = await openEventStore({ databaseUrl: url, schema, pollIntervalMs: 50 });
    context.children = [];
  });
  pg.after(async ({ store, children }) => {
    for (const c of children) c.child.kill('SIGKILL');
    await Promise.all(children.map((c) => c.exited));
    await store.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await store.query(`DROP SCHEMA IF EXISTS "${schema}_internal" CASCADE`);
    await store.close();
  });

  pg('the process holding the lease is killed (SIGKILL) with a timer scheduled: another process fires it once', async ({ store, children }) => {
    const victim = startChild(url, schema);
    children.push(victim);
    const holder = await until('the child started', async () => victim.lines.find((l) => l.holder)?.holder, 30_000, 20);
    await until('the child holding the lease', async () => (await sqlLeases(store).list(store)).some((l) => l.name === 'workflow:pings' && l.holder === holder && l.held), 30_000, 20);
    const survivor = pingProcessor({ store }, store, { leaseMs: 1000 });
    await survivor.processor.start();
    const id = randomBytes(4).toString('hex');
    await request(store, id, new Date(Date.now() + 1_000));
    await until('the child recording the schedule', async () => (await typesOf(store, workflowStream('pings', id))).includes('WorkflowInputScheduled'), 10_000, 20);
    victim.child.kill('SIGKILL');
    await victim.exited;
    assert.equal(victim.lines.filter((l) => l.fired), [], 'the child died before the timer was due');
    await until('the survivor firing the timer', async () => survivor.fired.length > 0, 20_000, 20);
    await settle();
    assert.equal(survivor.fired, [id], 'fired once');
    assert.is(await firings(store, id), 1);
    assert.equal(await typesOf(store, `pinged-${id}`), ['Pinged']);
    await survivor.processor.stop();
    assert.equal(survivor.errors.filter((e) => !/lease/i.test(String(e))), []);
  });

  pg('two live processes on one PostgreSQL fire each timer once', async ({ store, children }) => {
    const other = startChild(url, schema);
    children.push(other);
    await until('the child started', async () => other.lines.some((l) => l.holder), 30_000, 20);
    const here = pingProcessor({ store }, store, { leaseMs: 1000 });
    await here.processor.start();
    const ids = Array.from({ length: 10 }, () => randomBytes(4).toString('hex'));
    for (const [i, id] of ids.entries()) await request(store, id, new Date(Date.now() + 200 + 100 * i));
    const all = () => [...here.fired, ...other.lines.filter((l) => l.fired).map((l) => l.fired!)];
    await until('every timer firing', async () => ids.every((id) => all().includes(id)), 30_000, 20);
    await settle();
    assert.equal(all().sort(), [...ids].sort(), 'each fired once, in one process or the other');
    for (const id of ids) assert.is(await firings(store, id), 1);
    other.child.stdin!.end();
    await other.exited;
    await here.processor.stop();
  });

  pg.run();
}
