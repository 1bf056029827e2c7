/**
 * Processors' leases: of two runners on one database (two processes, on PostgreSQL two connection
 * pools; on PGlite one store with leases turned on), the one holding a projection's lease applies it
 * and the other reads nothing for it; a holder that dies is taken over within the lease and a claim;
 * a holder paused past its lease and overtaken writes nothing (the fence); a takeover waits for the
 * holder's transaction in flight. Workflows the same. PGlite always, PostgreSQL when DATABASE_URL is set.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomBytes, randomUUID } from 'node:crypto';
import { ProjectionRunner, runProjectionsCommand, sqlLeases, type LeaseStore, type Projection } from '../../src/processors/index.ts';
import { WorkflowProcessor } from '../../src/processors/index.ts';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { internalTable, type EventStore, type RecordedEvent } from '../../src/store/index.ts';
import { harvestSlotsWorkflow } from '../../workflows/harvest-slots.ts';
import { harvestDecider, type HarvestCommand } from '../../deciders/harvest.ts';
import { harvestQuotaDecider } from '../../deciders/harvest-quota.ts';
import { harvestQuotaStream, harvestStream } from '../../events/harvest.ts';
import { adaptersUnderTest, deferred } from '../store/adapters.ts';
import { ledgerProjection } from './fixtures.ts';
import { until } from '../support/until.ts';
import { within } from '../support/within.ts';

const settled = (tokens: number) => ({ id: randomUUID(), type: 'RequestSettled', data: { tokens } });

/** A projection of its own name (its own checkpoint and lease) that records what it is given. */
function counted(name: string, projection: Projection = ledgerProjection): Projection & { applied: RecordedEvent[] } {
  const applied: RecordedEvent[] = [];
  return {
    ...projection,
    name,
    applied,
    async apply(events, db) {
      await projection.apply(events, db);
      applied.push(...events);
    },
  };
}

/** The store as a process sees it, counting the log readers it opens. */
function counting(store: EventStore): { store: EventStore; readers: number } {
  const seen = { store: store, readers: 0 };
  seen.store = { ...store, subscribe: (options) => (seen.readers++, store.subscribe(options)) };
  return seen;
}

/** A process that can be killed: after `kill()` every call it makes to the database fails, as for a process gone (it renews and writes nothing). */
function killable(store: EventStore): { store: EventStore; kill(): void } {
  let dead = false;
  const proxy = new Proxy(store, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver);
      if (typeof value !== 'function') return value;
      return (...args: unknown[]) => (dead && property !== 'subscribe' ? Promise.reject(new Error('killed')) : value.apply(target, args));
    },
  });
  return { store: proxy, kill: () => (dead = true) };
}

async function leaseOf(store: EventStore, name: string) {
  return (await sqlLeases(store).list(store)).find((l) => l.name === name);
}

const newName = (what: string) => `test_lease_${what}_${randomBytes(3).toString('hex')}`;

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore; other: EventStore }>(`processor leases (${adapter.name})`);
  it.before(async (context) => {
    context.store = await adapter.open({ pollIntervalMs: 100 });
    // Another process: on PostgreSQL a second connection pool; PGlite is one process's.
    context.other = adapter.name === 'postgres' ? await adapter.open({ pollIntervalMs: 100 }) : context.store;
  });
  it.after(async (context) => {
    if (context.other !== context.store) await context.other?.close();
    await context.store?.close();
    await adapter.cleanup();
  });

  it('two runners on one database: the lease holder applies every event once, the other reads nothing and still sees the projection caught up', async ({ store, other }) => {
    const name = newName('twins');
    const [a, b] = [counted(name), counted(name)];
    const [seenA, seenB] = [counting(store), counting(other)];
    const runnerA = new ProjectionRunner({ store: seenA.store, projections: [a], leases: true, leaseMs: 2000, batchSize: 3, pollIntervalMs: 50 });
    const runnerB = new ProjectionRunner({ store: seenB.store, projections: [b], leases: true, leaseMs: 2000, batchSize: 3, pollIntervalMs: 50 });
    await runnerA.start();
    await runnerB.start();
    try {
      const meters = Array.from({ length: 8 }, () => `meter-${randomUUID()}`);
      await Promise.all(meters.map((m) => store.append(m, [settled(1), settled(2), settled(3)], 'no_stream')));
      await within(10_000, Promise.all([runnerA.caughtUp(), runnerB.caughtUp()]), 'both runners catching up');
      const ids = new Set(a.applied.filter((e) => meters.includes(e.streamId)).map((e) => e.id));
      assert.is(ids.size, 24, 'the holder applied every event');
      assert.is(a.applied.filter((e) => meters.includes(e.streamId)).length, 24, 'once each');
      assert.equal(b.applied, [], 'the other applied nothing');
      assert.is(seenA.readers, 1);
      assert.is(seenB.readers, 0, 'the other opened no reader of the log');
      const [statusB] = await runnerB.status();
      assert.is(statusB.holder, runnerA.leaseHolder);
      assert.ok(statusB.leaseHeld && statusB.leaseUntil!.getTime() > Date.now() - 5000);
      assert.is(statusB.live, false);
      assert.is((await runnerA.status())[0].live, true);
      assert.is(statusB.lag, 0, 'caught up, by the holder');
      // svc projections status shows who holds it, until when.
      let text = '';
      const io = { store, projections: [a], stdout: { write: (t: string) => (text += t) }, stderr: { write: () => {} } };
      assert.is(await runProjectionsCommand(['status'], io), 0);
      const line = text.split('\n').find((l) => l.startsWith(`${name} `)) ?? '';
      assert.ok(line.includes(` ${runnerA.leaseHolder}  `) && /\d{4}-\d\d-\d\dT[\d:.]+Z$/.test(line), line);
      text = '';
      assert.is(await runProjectionsCommand(['status', '--json'], io), 0);
      const json = (JSON.parse(text) as { name: string; holder: string; lease_held: boolean }[]).find((r) => r.name === name);
      assert.equal([json?.holder, json?.lease_held], [runnerA.leaseHolder, true]);
    } finally {
      await runnerB.stop();
      await runnerA.stop();
    }
  });

  it('a holder that dies (renews and writes nothing more) is taken over within the lease and a claim; the next one applies what came after', async ({ store, other }) => {
    const name = newName('takeover');
    const leaseMs = 900;
    const [a, b] = [counted(name), counted(name)];
    const dying = killable(store);
    const errors: unknown[] = [];
    const runnerA = new ProjectionRunner({ store: dying.store, projections: [a], leases: true, leaseMs, pollIntervalMs: 50, onError: (_, e) => errors.push(e) });
    const runnerB = new ProjectionRunner({ store: other, projections: [b], leases: true, leaseMs, pollIntervalMs: 50 });
    await runnerA.start();
    await runnerB.start();
    try {
      const before = `meter-${randomUUID()}`;
      await store.append(before, [settled(1)], 'no_stream');
      await within(10_000, runnerB.caughtUp(), 'the holder applying');
      assert.is((await leaseOf(store, name))?.holder, runnerA.leaseHolder);

      const killedAt = performance.now();
      dying.kill();
      await until('the other runner holding the lease', async () => (await leaseOf(store, name))?.holder === runnerB.leaseHolder, 10_000, 10);
      const takeoverMs = performance.now() - killedAt;
      console.log(`  takeover after the holder died: ${Math.round(takeoverMs)} ms (lease ${leaseMs} ms, claims every ${leaseMs / 3} ms)`);
      assert.ok(takeoverMs <= leaseMs + leaseMs / 3 + 500, `taken over after ${Math.round(takeoverMs)} ms`);

      const after = `meter-${randomUUID()}`;
      await store.append(after, [settled(5), settled(6)], 'no_stream');
      await within(10_000, runnerB.caughtUp(), 'the new holder applying');
      assert.equal(b.applied.filter((e) => e.streamId === after).length, 2);
      assert.equal(a.applied.filter((e) => e.streamId === after), [], 'the dead one applied nothing after');
      assert.equal(b.applied.filter((e) => e.streamId === before), [], 'nor did the new one apply again what the dead one had');
      assert.ok(errors.length > 0, 'the dead one failed to renew');
    } finally {
      await runnerB.stop();
      await runnerA.stop();
    }
  });

  it('a holder paused past its lease and overtaken writes nothing: the fence refuses its batch, rows and checkpoint unchanged', async ({ store, other }) => {
    const name = newName('fenced');
    const a = counted(name);
    // A long lease: the holder goes on believing it holds it (as a paused process does) until its next claim, 20 s away.
    const stale = new ProjectionRunner({ store, projections: [a], leases: true, leaseMs: 60_000, pollIntervalMs: 50 });
    await stale.start();
    try {
      await within(10_000, stale.caughtUp(), 'the holder catching up');
      const [before] = await stale.status();
      // Meanwhile its lease expired and another process took it.
      await store.query(`UPDATE ${internalTable(store, 'processor_leases')} SET holder = 'overtaker', epoch = epoch + 1, expires_at = clock_timestamp() + interval '1 minute' WHERE name = $1`, [name]);
      const meter = `meter-${randomUUID()}`;
      await store.append(meter, [settled(7), settled(8)], 'no_stream');
      await until('the stale holder to stop', async () => !(await stale.status())[0].live, 10_000, 20);
      assert.equal(a.applied.filter((e) => e.streamId === meter), [], 'its batch reached no projection');
      const { rows } = await store.query('SELECT * FROM test_ledger_rows WHERE stream_id = $1', [meter]);
      assert.equal(rows, [], 'no rows written');
      const [after] = await stale.status();
      assert.equal(after.position, before.position, 'checkpoint unchanged');
      assert.is(after.holder, 'overtaker');

      // The overtaker goes: the next runner takes over from the checkpoint and applies the batch, once.
      await store.query(`UPDATE ${internalTable(store, 'processor_leases')} SET expires_at = clock_timestamp() WHERE name = $1`, [name]);
      const b = counted(name);
      const next = new ProjectionRunner({ store: other, projections: [b], leases: true, leaseMs: 2000, pollIntervalMs: 50 });
      await next.start();
      await within(10_000, next.caughtUp(), 'the next holder catching up');
      assert.equal(b.applied.filter((e) => e.streamId === meter).length, 2);
      assert.is((await next.status())[0].holder, next.leaseHolder);
      await next.stop();
    } finally {
      await stale.stop();
    }
  });

  it("a takeover waits for the holder's transaction in flight, then goes on from the checkpoint it left: every event applied once", async ({ store, other }) => {
    const name = newName('inflight');
    const leaseMs = 600;
    const gate = deferred();
    const inside = deferred();
    const base = counted(name);
    const a: Projection & { applied: RecordedEvent[] } = {
      ...base,
      async apply(events, db) {
        if (events.some((e) => (e.data as { tokens: number }).tokens === 4321)) {
          inside.resolve();
          await gate.promise;
        }
        await base.apply(events, db);
      },
    };
    // The holder stops renewing once inside its transaction (a process paused there).
    let paused = false;
    const real = sqlLeases(store);
    const pausable: LeaseStore = { ...real, claim: (...args) => (paused ? Promise.resolve(new Map()) : real.claim(...args)) };
    const holder = new ProjectionRunner({ store, leaseStore: pausable, projections: [a], leases: true, leaseMs, pollIntervalMs: 50 });
    await holder.start();
    const b = counted(name);
    const next = new ProjectionRunner({ store: other, projections: [b], leases: true, leaseMs, pollIntervalMs: 50 });
    try {
      const meter = `meter-${randomUUID()}`;
      await store.append(meter, [settled(1), settled(4321)], 'no_stream');
      await within(10_000, inside.promise, 'the holder inside its transaction');
      paused = true;
      // PGlite runs one transaction at a time: there even the next runner's start waits for it.
      const starting = next.start();
      await new Promise((r) => setTimeout(r, 2 * leaseMs));
      if (adapter.name === 'postgres') assert.is((await leaseOf(store, name))?.holder, holder.leaseHolder, 'expired, but not taken while its transaction runs');
      gate.resolve();
      await starting;
      await until('the next runner holding the lease', async () => (await leaseOf(store, name))?.holder === next.leaseHolder, 10_000, 20);
      await store.append(meter, [settled(3)], 2);
      await within(10_000, next.caughtUp(), 'the next holder applying');
      const applied = [...base.applied, ...b.applied].filter((e) => e.streamId === meter).map((e) => e.id);
      assert.is(applied.length, 3, 'each event applied once');
      assert.is(new Set(applied).size, 3);
      assert.is(base.applied.filter((e) => e.streamId === meter).length, 2, 'the batch in flight committed');
    } finally {
      gate.resolve();
      await next.stop();
      await holder.stop();
    }
  });

  it('a runner that stops lets its leases go: another takes over at its next claim, well before the lease would expire', async ({ store, other }) => {
    const name = newName('handover');
    const leaseMs = 3000;
    const first = new ProjectionRunner({ store, projections: [counted(name)], leases: true, leaseMs, pollIntervalMs: 50 });
    const second = new ProjectionRunner({ store: other, projections: [counted(name)], leases: true, leaseMs, pollIntervalMs: 50 });
    await first.start();
    await second.start();
    const stoppedAt = performance.now();
    await first.stop();
    await until('the second runner holding the lease', async () => (await leaseOf(store, name))?.holder === second.leaseHolder, 10_000, 10);
    const handoverMs = performance.now() - stoppedAt;
    assert.ok(handoverMs < leaseMs / 3 + 500, `handed over after ${Math.round(handoverMs)} ms`);
    await second.stop();
  });

  it('two workflow processors: only the lease holder sends commands, and the other sees the workflow caught up on its checkpoint', async ({ store, other }) => {
    const keyId = randomBytes(6).toString('hex');
    const sent = { a: 0, b: 0 };
    const sending = (store: EventStore, who: 'a' | 'b') => {
      const handler = new CommandHandler({ store });
      return new Proxy(handler, {
        get(target, property, receiver) {
          const value = Reflect.get(target, property, receiver);
          if (property === 'handle') return (...args: Parameters<CommandHandler['handle']>) => (sent[who]++, target.handle(...args));
          return typeof value === 'function' ? value.bind(target) : value;
        },
      });
    };
    const errors: unknown[] = [];
    const settings = { workflows: [harvestSlotsWorkflow], leases: true, leaseMs: 2000, pollIntervalMs: 50, idleCheckpointMs: 100, onError: (_: string, e: unknown) => errors.push(e) };
    const first = new WorkflowProcessor({ store, handler: sending(store, 'a'), ...settings });
    const second = new WorkflowProcessor({ store: other, handler: sending(other, 'b'), ...settings });
    await first.start();
    await second.start();
    try {
      const handler = new CommandHandler({ store });
      const jobs = [];
      for (let i = 0; i < 3; i++) {
        const jobId = `hj_${randomBytes(12).toString('hex')}`;
        const now = new Date().toISOString();
        assert.ok((await handler.handle(harvestQuotaStream(keyId), { type: 'Admit', jobId, now, monthlyQuota: 10, runningCap: 5, staleAfterMs: 3_600_000, jobs: [] }, harvestQuotaDecider)).accepted);
        const plan = { job_id: jobId, key_id: keyId, key_prefix: keyId, user_id: 'u', model: 'gpt2', checkpoint: 'main', prompt_count: 1, estimated_tokens: 1, layers: [0], d_model: 8, shard_size: 32, batch_size: 1, shard_count: 1, input_sha256: 'a'.repeat(64), month: now.slice(0, 7), at: now };
        for (const command of [{ type: 'Submit', job: plan }, { type: 'Fail', code: 'stale', message: 'aged out', claimId: null, now }] as HarvestCommand[]) {
          assert.ok((await handler.handle(harvestStream(jobId), command, harvestDecider)).accepted);
        }
        jobs.push(jobId);
      }
      await within(10_000, first.caughtUp(), 'the holder catching up');
      // Past its last input, the log goes on with events it passes over: the holder's checkpoint moves past them too.
      await store.append(`noise-${randomUUID()}`, [{ id: randomUUID(), type: 'Unrelated', data: {} }], 'no_stream');
      await within(10_000, second.caughtUp(), 'the processor without the lease seeing the workflow caught up');
      const released = (await store.readStream(harvestQuotaStream(keyId))).events.filter((e) => e.type === 'HarvestSlotReleased').map((e) => (e.data as { job_id: string }).job_id);
      assert.equal(released.sort(), [...jobs].sort(), 'each slot released once');
      assert.is(sent.a, 3, 'the holder sent the releases');
      assert.is(sent.b, 0, 'the other sent nothing');
      assert.equal(errors, []);
    } finally {
      await second.stop();
      await first.stop();
    }
  });

  if (adapter.name === 'pglite') {
    it('on the embedded store a runner holds every lease without claiming one: one process serves it', async ({ store }) => {
      const name = newName('embedded');
      const runner = new ProjectionRunner({ store, projections: [counted(name)] });
      await runner.start();
      const meter = `meter-${randomUUID()}`;
      await store.append(meter, [settled(2)], 'no_stream');
      await within(10_000, runner.caughtUp(), 'the runner catching up');
      const [status] = await runner.status();
      assert.is(status.live, true);
      assert.is(status.holder, null, 'no lease taken');
      assert.is((await leaseOf(store, name))?.epoch, 0);
      await runner.stop();
    });
  }

  it.run();
}
