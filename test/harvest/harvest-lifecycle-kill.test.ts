/**
 * A harvest job's processes SIGKILLed at every step of its life, on PostgreSQL, with real processes: a
 * gateway (`svc serve --no-workers`: the HTTP API and the processors) and two `svc worker`s, each
 * running the workflow processor, on the reference engine. First a job runs untouched: its commits on
 * its job stream, its key's quota stream, the harvest-slots workflow's stream and the key's meter
 * stream (renewals left out), in order, are the steps (each named by the commit's last event: `<stream>
 * <type> #<occurrence>`), so the list follows the event flow. Then jobs run again, each step k armed in
 * turn (several per job; one a job passed over waits for the next job): a trigger on the events table
 * marks the commit of step k and holds every later event insert before it commits, so the kill lands
 * after k and before anything else is stored. Killed then: the process that wrote k, the holders of the harvest workflows'
 * leases and the worker holding the job's claim; their connections are ended, new processes are
 * started, the next step is armed. Whatever the step, the job succeeds with shards 0..n-1 recorded once
 * each (files and manifest matching the records), its slot released once and counted, no budget hold
 * left open, and its key admits a new job (the running cap is 1). Killed after its admission, before
 * the job was recorded, the job never exists: the next admission once it is an orphan releases its
 * slot uncounted. Skipped without DATABASE_URL.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import pg from 'pg';
import { startHarvestStack, crash, type HarvestStack } from '../support/harvest-stack.ts';
import { postgresUnavailable } from '../support/postgres.ts';
import { json } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { harvestQuotaStream, harvestStream } from '../../events/harvest.ts';
import { meterEvents, meterStream, utcDay } from '../../events/meter.ts';
import { meterDecider } from '../../deciders/meter.ts';
import { harvestOrphanAdmissionMs } from '../../deciders/harvest-quota.ts';
import { workflowStream } from '../../src/event-sourcing/index.ts';
import { parseManifest } from '../../src/harvest/manifest.ts';

const databaseUrl = process.env.DATABASE_URL;
const unavailable = await postgresUnavailable(databaseUrl);
const it = suite('a harvest whose processes are SIGKILLed at every step of its life (PostgreSQL, real processes)');

type Scope = 'job' | 'quota' | 'slots' | 'meter';
/** A step: the `occurrence`-th event of `type` on the scope's stream (on the meter, of the batch of prompts from `batch` on, if it names one). */
interface Step {
  scope: Scope;
  type: string;
  batch: string | null;
  occurrence: number;
}
const stepName = (s: Step) => `${s.scope} ${s.type}${s.batch === null ? '' : ` (batch ${s.batch})`} #${s.occurrence}`;
/** The batch a harvest's meter request is (its request id: `<jobId>:<first prompt>@<claim>`); null for other events. */
const batchOf = (data: { request_id?: unknown }): string | null => (typeof data.request_id === 'string' ? (/:(\d+)@/.exec(data.request_id)?.[1] ?? null) : null);
/** Written on a timer whatever the job does: not steps of its life. */
const timed = new Set(['ReservationRenewed', 'SlotLeaseRenewed', 'QueueEntriesRenewed', 'HarvestClaimRenewed']);
const prompts = ['first prompt', 'second prompt', 'third prompt'];
const harvestLeases = ['workflow:harvest-slots', 'workflow:harvest-resumer'];

interface Proc {
  tag: string;
  role: 'serve' | 'worker';
  child?: ChildProcess;
  /** Once a gateway listens. */
  url?: string;
}

interface Key {
  key: string;
  keyId: string;
  prefix: string;
}

/** The streams of one key's job: the job's own once admitted. */
function streamsOf(key: Key) {
  return { quota: harvestQuotaStream(key.keyId), slots: workflowStream('harvest-slots', key.keyId), meter: meterStream(key.prefix, utcDay(new Date())) };
}

if (!unavailable) {
  let stack: HarvestStack;
  let db: pg.Pool;
  let procs: Proc[] = [];
  let spawned = 0;
  let lockKey = 7_000_001;

  let starting: Promise<unknown> = Promise.resolve();
  /** Starts a process after those already starting (one start at a time spares the CPU); it counts among the processes from its spawn on. */
  const spawnProc = (role: Proc['role']): Promise<unknown> => {
    // Its connections carry its tag, so the test can end those of a process it killed.
    const proc: Proc = { tag: `crash-proc-${++spawned}`, role };
    procs.push(proc);
    const spawnedAs = (child: ChildProcess) => void (proc.child = child);
    const env = { PGAPPNAME: proc.tag };
    starting = starting.then(async () => {
      if (!procs.includes(proc)) return;
      if (role === 'serve') proc.url = (await stack.serve(env, ['--no-workers'], spawnedAs).catch(() => null))?.url;
      else await stack.worker(env, spawnedAs).catch(() => null);
    });
    return starting;
  };
  /** A gateway that listens (the first of them). */
  const gateway = async () => (await until('a gateway listening', async () => procs.find((p) => p.role === 'serve' && p.url)?.url, 120_000, 50))!;
  const query = async <T extends pg.QueryResultRow>(sql: string, params: unknown[] = []) => (await db.query<T>(sql, params)).rows;
  const eventsOf = (stream: string) =>
    query<{ type: string; data: any; metadata: Record<string, unknown>; position: string; tx: string }>('SELECT event_type AS type, data, metadata, global_position::text AS position, transaction_id::text AS tx FROM events WHERE stream_id = $1 ORDER BY stream_version', [stream]);
  const jobOf = async (key: Key): Promise<string | null> =>
    (await eventsOf(harvestQuotaStream(key.keyId))).filter((e) => e.type === 'HarvestJobAdmitted').map((e) => e.data.job_id as string).at(-1) ?? null;
  const streamOf = async (scope: Scope, key: Key): Promise<string | null> => {
    if (scope !== 'job') return streamsOf(key)[scope];
    const job = await jobOf(key);
    return job ? harvestStream(job) : null;
  };
  const occurred = async (step: Step, key: Key): Promise<boolean> => {
    const stream = await streamOf(step.scope, key);
    return stream !== null && (await eventsOf(stream)).filter((e) => e.type === step.type && batchOf(e.data) === step.batch).length > step.occurrence;
  };

  const issue = async (email: string): Promise<Key> => {
    const res = await fetch(`${await gateway()}/admin/keys`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${stack.adminToken}` }, body: JSON.stringify({ email }) });
    const body = await json(res);
    assert.is(res.status, 201, JSON.stringify(body));
    return { key: body.key, keyId: body.key_id, prefix: body.prefix };
  };
  const submit = async (key: string) =>
    fetch(`${await gateway()}/v1/harvest`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'ref-byte', prompts, layers: [0], shard_size: 1, batch_size: 1 }),
    });

  /** Arms `step` (null: nothing) and lets the held inserts go, under a fresh lock for the next hold. */
  const arm = async (step: Step | null, key: Key) => {
    const next = ++lockKey;
    await controlQuery('SELECT pg_advisory_lock($1)', [next]);
    const [{ old }] = await query<{ old: string }>('SELECT lock_key::text AS old FROM crash_arm WHERE id = 1');
    const fixed = step && step.scope !== 'job' ? streamsOf(key)[step.scope] : null;
    await query('UPDATE crash_arm SET frozen = false, writer = NULL, lock_key = $1, stream_id = $2, quota_stream = $3, event_type = $4, occurrence = $5, batch = $6 WHERE id = 1', [
      next,
      fixed,
      harvestQuotaStream(key.keyId),
      step?.type ?? null,
      step?.occurrence ?? null,
      step?.batch ?? null,
    ]);
    await controlQuery('SELECT pg_advisory_unlock($1)', [Number(old)]);
  };

  /** Kills the writer of the held step, the harvest workflows' lease holders and the job's claim holder; starts their like again. */
  const killAt = async (writer: string | null, key: Key, next: Step | null): Promise<string[]> => {
    const pids = new Set<number>();
    for (const l of await query<{ holder: string | null }>(`SELECT holder FROM ${leaseTable} WHERE name = ANY($1) AND expires_at > now()`, [harvestLeases])) {
      if (l.holder) pids.add(Number(l.holder.split(':')[1]));
    }
    const job = await jobOf(key);
    if (job) {
      const events = await eventsOf(harvestStream(job));
      const claim = events.filter((e) => e.type === 'HarvestClaimed').at(-1);
      const ended = events.some((e) => ['HarvestSucceeded', 'HarvestFailed', 'HarvestCancelled', 'HarvestStartFailed'].includes(e.type));
      const pid = claim ? /^worker-(\d+)-/.exec(claim.data.worker_id)?.[1] : undefined;
      if (pid && !ended) pids.add(Number(pid));
    }
    const victims = procs.filter((p) => p.tag === writer || (p.child && pids.has(p.child.pid!)));
    await Promise.all(victims.map((v) => (v.child ? crash(v.child) : null)));
    procs = procs.filter((p) => !victims.includes(p));
    // A dead process's transaction held before its commit must never commit: its connections are ended first.
    const tags = victims.map((v) => v.tag);
    await query('SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = ANY($1)', [tags]);
    await until('the killed processes\' connections gone', async () => (await query('SELECT 1 FROM pg_stat_activity WHERE application_name = ANY($1)', [tags])).length === 0, 30_000, 20);
    await arm(next, key);
    // Their like started again, while the others go on.
    for (const v of victims) void spawnProc(v.role);
    return victims.map((v) => v.role);
  };
  let leaseTable = '';
  let control: pg.PoolClient;
  const controlQuery = async <T extends pg.QueryResultRow>(sql: string, params: unknown[] = []) => (await control.query<T>(sql, params)).rows;

  /** The job's end as a normal run leaves it: succeeded, shards once, files and manifest, slot released once, no hold open. */
  const checkEnd = async (key: Key, jobId: string) => {
    const events = await eventsOf(harvestStream(jobId));
    const types = events.map((e) => e.type);
    assert.ok(types.includes('HarvestSucceeded'), `the job succeeded: ${types.join(' ')}`);
    const shards = events.filter((e) => e.type === 'HarvestShardWritten').map((e) => e.data);
    assert.equal(
      shards.map((s) => s.shard),
      prompts.map((_, i) => i),
      'each shard recorded once, in order',
    );
    for (const s of shards) {
      const bytes = readFileSync(join(stack.harvestDir, jobId, s.file));
      assert.is(createHash('sha256').update(bytes).digest('hex'), s.sha256, `shard ${s.shard}'s file is the one recorded`);
    }
    const manifest = parseManifest(readFileSync(join(stack.harvestDir, jobId, 'manifest.json'), 'utf8'));
    assert.equal(
      manifest.shards.map((m) => [m.index, m.file, m.sha256, m.bytes]),
      shards.map((s) => [s.shard, s.file, s.sha256, s.bytes]),
      "the manifest's shards are the recorded ones",
    );
    const released = (await eventsOf(harvestQuotaStream(key.keyId))).filter((e) => e.type === 'HarvestSlotReleased');
    assert.equal(
      released.map((e) => [e.data.job_id, e.data.counted]),
      [[jobId, true]],
      'the slot released once, counted',
    );
    await until(
      'no budget hold left open on the key',
      async () => {
        const recorded = await eventsOf(streamsOf(key).meter);
        const state = recorded.reduce((s, e) => meterDecider.evolve(s, meterEvents.parse({ type: e.type, data: e.data, metadata: e.metadata })), meterDecider.initialState());
        return state.holds.size === 0;
      },
      60_000,
    );
  };

  it.before(async () => {
    if (process.env.CRASH_TEST_LOG) console.log('before', new Date().toISOString());
    stack = await startHarvestStack({
      name: 'lifecycle_kill',
      postgres: databaseUrl!,
      // Short leases (harvest claims, processors, reservations): a dead holder's work is taken over within seconds.
      env: { SVC_HARVEST_LEASE_MS: '1500', SVC_PROCESSOR_LEASE_MS: '600', SVC_RESERVATION_TTL_MS: '3000', SVC_HARVEST_MAX_RUNNING_PER_KEY: '1' },
    });
    await spawnProc('serve');
    await spawnProc('worker');
    await spawnProc('worker');
    // Each capture takes a while, so a job's events are spread out.
    await stack.chaos({ mode: 'delay', count: 1_000_000, delay_ms: 100 });
    db = new pg.Pool({ connectionString: stack.databaseUrl!, application_name: 'crash-test', max: 4 });
    // The lock that holds the inserts is a session's: one connection of its own.
    control = await db.connect();
    const [{ schema }] = await query<{ schema: string }>("SELECT table_schema AS schema FROM information_schema.tables WHERE table_name = 'processor_leases'");
    leaseTable = `"${schema}".processor_leases`;
    await db.query(`
      CREATE TABLE crash_arm (id int PRIMARY KEY, stream_id text, quota_stream text, event_type text, batch text, occurrence int, frozen boolean NOT NULL DEFAULT false, frozen_by xid8, lock_key bigint NOT NULL, writer text);
      INSERT INTO crash_arm (id, lock_key) VALUES (1, ${lockKey});
      -- Every event insert waits while a step is held (the test holds the lock until it has killed), but the held step's own transaction's.
      CREATE FUNCTION crash_hold() RETURNS trigger LANGUAGE plpgsql AS $$
      DECLARE a crash_arm;
      BEGIN
        SELECT * INTO a FROM crash_arm WHERE id = 1;
        IF a.frozen AND a.frozen_by <> pg_current_xact_id() THEN PERFORM pg_advisory_xact_lock_shared(a.lock_key); END IF;
        RETURN NEW;
      END $$;
      -- The armed step's event, once inserted, holds everything after it (from its commit on).
      CREATE FUNCTION crash_mark() RETURNS trigger LANGUAGE plpgsql AS $$
      DECLARE a crash_arm; target text;
      BEGIN
        SELECT * INTO a FROM crash_arm WHERE id = 1;
        IF a.event_type IS NULL OR a.frozen OR NEW.event_type <> a.event_type THEN RETURN NULL; END IF;
        target := a.stream_id;
        IF target IS NULL THEN
          SELECT 'harvest-' || (data->>'job_id') INTO target FROM events WHERE stream_id = a.quota_stream AND event_type = 'HarvestJobAdmitted' ORDER BY stream_version DESC LIMIT 1;
        END IF;
        IF target IS NULL OR NEW.stream_id <> target THEN RETURN NULL; END IF;
        IF (substring(NEW.data->>'request_id' from ':(\\d+)@') IS DISTINCT FROM a.batch) THEN RETURN NULL; END IF;
        IF (SELECT count(*) FROM events WHERE stream_id = NEW.stream_id AND event_type = NEW.event_type AND stream_version <= NEW.stream_version
            AND substring(data->>'request_id' from ':(\\d+)@') IS NOT DISTINCT FROM a.batch) <> a.occurrence + 1 THEN RETURN NULL; END IF;
        UPDATE crash_arm SET frozen = true, frozen_by = pg_current_xact_id(), writer = current_setting('application_name'), event_type = NULL WHERE id = 1;
        RETURN NULL;
      END $$;
      CREATE TRIGGER crash_hold BEFORE INSERT ON events FOR EACH ROW EXECUTE FUNCTION crash_hold();
      CREATE TRIGGER crash_mark AFTER INSERT ON events FOR EACH ROW EXECUTE FUNCTION crash_mark();
    `);
    await controlQuery('SELECT pg_advisory_lock($1)', [lockKey]);
    if (process.env.CRASH_TEST_LOG) console.log('started', new Date().toISOString());
  });

  it.after(async () => {
    control?.release();
    await db?.end().catch(() => undefined);
    // Killed too: a drain would only take time.
    await Promise.all(procs.map((p) => (p.child ? crash(p.child) : null)));
    await stack?.stop();
  });

  it('killed at each step of its life: each shard recorded once, the job succeeded, the slot freed once, no hold left', async () => {
    // The steps: what an untouched job writes, in order.
    const calibration = await issue('calibration@example.org');
    assert.is((await submit(calibration.key)).status, 202);
    const jobId = await until('the untouched job admitted', () => jobOf(calibration));
    await until('the untouched job ended and its slot released', async () =>
      (await eventsOf(harvestQuotaStream(calibration.keyId))).some((e) => e.type === 'HarvestSlotReleased') &&
      (await eventsOf(streamsOf(calibration).slots)).length > 0,
    );
    await checkEnd(calibration, jobId);
    const scoped: { scope: Scope; stream: string }[] = [
      { scope: 'job', stream: harvestStream(jobId) },
      ...(['quota', 'slots', 'meter'] as const).map((scope) => ({ scope, stream: streamsOf(calibration)[scope] })),
    ];
    const all = (
      await Promise.all(scoped.map(async ({ scope, stream }) => (await eventsOf(stream)).filter((e) => !timed.has(e.type)).map((e) => ({ scope, type: e.type, batch: batchOf(e.data), position: BigInt(e.position), tx: e.tx }))))
    ).flat();
    all.sort((a, b) => (a.position < b.position ? -1 : 1));
    // A step is a commit: the last of the events one transaction wrote (those before it cannot be stored without it).
    const lastOfTx = new Map(all.map((e) => [e.tx, e]));
    const seen = new Map<string, number>();
    const steps: Step[] = [];
    for (const e of all) {
      const batch = e.scope === 'meter' ? e.batch : null;
      const occurrence = seen.get(`${e.scope} ${e.type} ${batch}`) ?? 0;
      seen.set(`${e.scope} ${e.type} ${batch}`, occurrence + 1);
      // A process's slot lease on the key's meter is taken again by whichever processes happen to serve the key
      // (how many depends on the kills): its first taking is a step of the life, the others are not.
      if (e.type === 'SlotsLeased' && occurrence > 0) continue;
      if (lastOfTx.get(e.tx) === e) steps.push({ scope: e.scope, type: e.type, batch, occurrence });
    }
    for (const type of ['HarvestJobAdmitted', 'HarvestSubmitted', 'HarvestStarted', 'HarvestClaimed', 'HarvestShardWritten', 'HarvestSucceeded', 'HarvestSlotReleased']) {
      assert.ok(steps.some((s) => s.type === type), `the life has a ${type} step: ${steps.map(stepName).join(', ')}`);
    }

    if (process.env.CRASH_TEST_LOG) console.log(steps.map(stepName));
    // Each step killed in turn, several per job; a step the job has passed (its flow changed by a kill) waits for the next job.
    const pending = [...steps];
    const log: string[] = [];
    const keys: Key[] = [];
    let orphan: (Key & { jobId: string; admittedAt: string }) | null = null;
    for (let run = 0; pending.length > 0; run++) {
      assert.ok(run < 2 * steps.length, `steps never reached: ${pending.map(stepName).join(', ')}`);
      const key = await issue(`kill-run-${run}@example.org`);
      keys.push(key);
      let armed: Step | null = pending[0];
      await arm(armed, key);
      const submitted = submit(key.key).catch(() => null);
      const complete = async () => {
        for (const s of steps) if (!(await occurred(s, key))) return false;
        return true;
      };
      for (;;) {
        const state = await until(
          `step ${armed ? stepName(armed) : '(none)'} or the job's end`,
          async () => {
            // The end read first: a step committed meanwhile is seen held.
            const ended = await complete();
            const [row] = await query<{ frozen: boolean; writer: string | null }>('SELECT frozen, writer FROM crash_arm WHERE id = 1');
            if (row.frozen) return row;
            return ended ? { frozen: false, writer: null } : null;
          },
          120_000,
          15,
        ).catch(async (error) => {
          // Stuck: what the job and its key hold, to see where.
          const job = await jobOf(key);
          const held = async (stream: string | null) => (stream ? (await eventsOf(stream)).map((e) => (e.type === 'HarvestShardWritten' ? `${e.type}(${e.data.shard})` : e.type)).join(' ') : '-');
          throw new Error(`${error.message} (run ${run}, after ${log.slice(-3).join('; ')}); job: ${await held(job && harvestStream(job))}; quota: ${await held(streamsOf(key).quota)}`);
        });
        if (!state.frozen) break;
        const killed: Step = armed!;
        pending.splice(pending.indexOf(killed), 1);
        const admission = killed.scope === 'quota' && killed.type === 'HarvestJobAdmitted';
        // The next step still ahead in this job (after an admission killed, the job is never recorded: none).
        let next: Step | null = null;
        if (!admission) for (const s of pending) if (!(await occurred(s, key))) { next = s; break; }
        const roles = await killAt(state.writer, key, next);
        log.push(`${stepName(killed)}: killed ${roles.join(' and ') || 'nothing'}`);
        if (process.env.CRASH_TEST_LOG) console.log(`run ${run}, ${new Date().toISOString()}: ${log.at(-1)}`);
        armed = next;
        if (admission) {
          const jobId = (await jobOf(key))!;
          assert.equal(await eventsOf(harvestStream(jobId)), [], 'killed after its admission, the job was never recorded');
          const admittedAt = (await eventsOf(harvestQuotaStream(key.keyId))).find((e) => e.type === 'HarvestJobAdmitted')!.data.at;
          orphan = { ...key, jobId, admittedAt };
          keys.pop();
          break;
        }
      }
      await arm(null, key);
      const response = await submitted;
      if (response) await response.arrayBuffer().catch(() => undefined);
      if (orphan?.keyId !== key.keyId) await checkEnd(key, (await jobOf(key))!);
    }
    assert.is(log.length, steps.length, log.join('\n'));

    // Every key's slot is free: with a running cap of 1, each admits a new job at once.
    for (const key of keys) {
      const res = await submit(key.key);
      const body = await json(res);
      assert.is(res.status, 202, JSON.stringify(body));
      const id = body.id;
      await fetch(`${await gateway()}/v1/harvest/${id}`, { method: 'DELETE', headers: { authorization: `Bearer ${key.key}` } });
    }
    // The job killed after its admission: the first admission once it is an orphan releases its slot, uncounted, once.
    if (orphan) {
      const at = Date.parse(orphan.admittedAt) + harvestOrphanAdmissionMs + 1_000;
      await until('the killed admission an orphan', async () => Date.now() >= at, harvestOrphanAdmissionMs + 60_000, 250);
      const res = await submit(orphan.key);
      assert.is(res.status, 202, JSON.stringify(await json(res)));
      const released = (await eventsOf(harvestQuotaStream(orphan.keyId))).filter((e) => e.type === 'HarvestSlotReleased');
      assert.equal(
        released.map((e) => [e.data.job_id, e.data.counted]),
        [[orphan.jobId, false]],
        "the orphan's slot released once, uncounted",
      );
    }
  });
} else {
  it.skip(`real processes killed at each step of a harvest: ${unavailable}`, () => {});
}

it.run();
