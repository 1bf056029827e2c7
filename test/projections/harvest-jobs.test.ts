/**
 * harvest_jobs and harvest_shards over events the real harvest decider writes: exact rows, idempotence
 * (the same events applied twice), the query helpers, and `svc projections rebuild` reproducing both
 * tables row for row, in any cut of the log into batches. PGlite always, PostgreSQL when DATABASE_URL is set.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomBytes, randomUUID } from 'node:crypto';
import type { EventStore } from '../../src/store/index.ts';
import { ProjectionRunner, runProjectionsCommand } from '../../src/processors/index.ts';
import { decisionEvents, foldEvents, isRejection } from '../../src/event-sourcing/index.ts';
import { harvestJobRow, harvestJobsProjection, harvestShardRows, listHarvestJobs, projections, resumableHarvestJobs } from '../../projections/index.ts';
import { harvestDecider, plannedShard, type HarvestCommand } from '../../deciders/harvest.ts';
import { harvestStream, type HarvestEvent, type HarvestSubmittedData } from '../../events/harvest.ts';
import { adaptersUnderTest } from '../store/adapters.ts';
import { applyTwice, recorded } from '../support/projection-specification.ts';

const t0 = Date.parse('2026-11-26T12:00:00.000Z');
const t = (s: number) => new Date(t0 + s * 1000).toISOString();
const leaseMs = 60_000;
const sha = (c: string) => c.repeat(64);
const newJob = () => `hj_${randomBytes(12).toString('hex')}`;

function plan(jobId: string, userId: string, s = 0, over: Partial<HarvestSubmittedData> = {}): HarvestSubmittedData {
  return { job_id: jobId, key_id: 'k1', key_prefix: 'k1', user_id: userId, model: 'gpt2', checkpoint: 'main', prompt_count: 70, estimated_tokens: 900, layers: [0, 5, 11], d_model: 768, shard_size: 32, batch_size: 8, shard_count: 3, input_sha256: sha('a'), month: '2026-11', at: t(s), ...over };
}
const shard = (jobId: string, claimId: string, n: number, s: number): HarvestCommand => ({
  type: 'RecordShard', claimId, now: t(s), leaseMs,
  record: { shard: n, file: `shard-${String(n).padStart(5, '0')}-${claimId}.safetensors`, first_prompt: plannedShard({ shard_size: 32, prompt_count: 70 }, n).firstPrompt,
    prompt_count: plannedShard({ shard_size: 32, prompt_count: 70 }, n).promptCount, token_count: 100 + n, bytes: 1000 * (n + 1), sha256: sha(String(n)) },
});

/** The events the decider writes for these commands, in order (a refusal is a fixture's bug). */
function decided(commands: HarvestCommand[]): HarvestEvent[] {
  let state = harvestDecider.initialState();
  const out: HarvestEvent[] = [];
  for (const command of commands) {
    const events = decisionEvents(harvestDecider.decide(command, state));
    if (isRejection(events)) throw new Error(`${command.type} refused: ${events.message}`);
    out.push(...events);
    state = foldEvents(harvestDecider, state, events);
  }
  return out;
}

/** Five jobs of one user: succeeded, running (a worker lost once, another claiming), start failed, cancelled, pending. */
function scenario(userId: string) {
  const ids = { succeeded: newJob(), running: newJob(), startFailed: newJob(), cancelled: newJob(), pending: newJob() };
  const start = (s: number): HarvestCommand => ({ type: 'Start', transport: 'inprocess', now: t(s) });
  const claim = (id: string, s: number): HarvestCommand => ({ type: 'Claim', claimId: id, workerId: `w-${id}`, now: t(s), leaseMs });
  const streams: Record<string, HarvestEvent[]> = {
    [ids.succeeded]: decided([
      { type: 'Submit', job: plan(ids.succeeded, userId, 0) }, start(1), claim('a', 2), shard(ids.succeeded, 'a', 0, 10), shard(ids.succeeded, 'a', 1, 20), shard(ids.succeeded, 'a', 2, 30),
      { type: 'Succeed', claimId: 'a', manifestSha256: sha('f'), manifestBytes: 2048, now: t(31) },
    ]),
    [ids.running]: decided([
      { type: 'Submit', job: plan(ids.running, userId, 100) }, start(101), claim('b', 102), shard(ids.running, 'b', 0, 110),
      { type: 'Redispatch', now: t(200), leaseMs, maxRedispatches: 3, reason: 'lease lapsed' }, claim('c', 210), { type: 'RenewClaim', claimId: 'c', now: t(240), leaseMs },
    ]),
    [ids.startFailed]: decided([{ type: 'Submit', job: plan(ids.startFailed, userId, 300) }, { type: 'FailStart', jobId: ids.startFailed, keyId: 'k1', reason: 'spawn ENOENT', now: t(301) }]),
    [ids.cancelled]: decided([{ type: 'Submit', job: plan(ids.cancelled, userId, 400) }, start(401), { type: 'Cancel', byKeyPrefix: 'k2', now: t(402) }]),
    [ids.pending]: decided([{ type: 'Submit', job: plan(ids.pending, userId, 500, { layers: [3], prompt_count: 1, shard_count: 1 }) }]),
  };
  // Interleaved by time across the streams, as the log would hold them.
  const all = Object.entries(streams).flatMap(([jobId, events]) => events.map((event, i) => ({ event, jobId, version: i + 1, at: Date.parse((event.data as { at: string }).at) })));
  all.sort((a, b) => a.at - b.at);
  return { ids, streams, events: all.map(({ event, jobId, version }) => recorded(event, { streamId: harvestStream(jobId), streamVersion: version })) };
}

const iso = (v: unknown) => (v === null || v === undefined ? null : new Date(v as string).toISOString());
const jobsQuery = (ids: string[]) =>
  `SELECT job_id, status, shards_done, prompts_done, tokens_done, bytes_done, started_at, finished_at, last_progress_at, worker_id, lease_until, redispatches, redispatched_at,
     error_code, error_message, to_char(month, 'YYYY-MM') AS month, counted, manifest_sha256, layers
   FROM harvest_jobs WHERE job_id IN (${ids.map((id) => `'${id}'`).join(', ')}) ORDER BY submitted_at`;

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore }>(`harvest_jobs projection (${adapter.name})`);
  it.before(async (context) => {
    context.store = await adapter.open({ pollIntervalMs: 100 });
  });
  it.after(async (context) => {
    await context.store?.close();
    await adapter.cleanup();
  });

  it('one row per job: its status, progress, lease and outcome as its last event left them; applied twice, the same rows', async ({ store }) => {
    const { ids, events } = scenario('ada');
    const rows = await applyTwice(store, harvestJobsProjection, events, jobsQuery(Object.values(ids)));
    // bigint columns come back as strings from node-postgres, as numbers from PGlite
    const numbers = rows.map((r) => ({
      ...r,
      tokens_done: Number(r.tokens_done),
      bytes_done: Number(r.bytes_done),
      started_at: iso(r.started_at),
      finished_at: iso(r.finished_at),
      last_progress_at: iso(r.last_progress_at),
      lease_until: iso(r.lease_until),
      redispatched_at: iso(r.redispatched_at),
    }));
    const base = { shards_done: 0, prompts_done: 0, tokens_done: 0, bytes_done: 0, worker_id: null, lease_until: null, redispatches: 0, redispatched_at: null, error_code: null, error_message: null, month: '2026-11', counted: true, manifest_sha256: null, layers: [0, 5, 11] };
    assert.equal(numbers, [
      { ...base, job_id: ids.succeeded, status: 'succeeded', shards_done: 3, prompts_done: 70, tokens_done: 303, bytes_done: 6000, started_at: t(1), finished_at: t(31), last_progress_at: t(30), worker_id: 'w-a', manifest_sha256: sha('f') },
      { ...base, job_id: ids.running, status: 'running', shards_done: 1, prompts_done: 32, tokens_done: 100, bytes_done: 1000, started_at: t(101), finished_at: null, last_progress_at: t(110), worker_id: 'w-c', lease_until: t(300), redispatches: 1, redispatched_at: t(200) },
      { ...base, job_id: ids.startFailed, status: 'failed', started_at: null, finished_at: t(301), last_progress_at: t(300), error_code: 'start_failed', error_message: 'spawn ENOENT', counted: false },
      { ...base, job_id: ids.cancelled, status: 'cancelled', started_at: t(401), finished_at: t(402), last_progress_at: t(401) },
      { ...base, job_id: ids.pending, status: 'pending', started_at: null, finished_at: null, last_progress_at: t(500), layers: [3] },
    ]);
    const shards = await applyTwice(store, harvestJobsProjection, events, `SELECT job_id, shard, file, first_prompt, prompt_count, token_count::int, bytes::int, sha256 FROM harvest_shards WHERE job_id IN ('${ids.succeeded}', '${ids.running}') ORDER BY job_id, shard`);
    assert.equal(shards.filter((s) => s.job_id === ids.succeeded).map((s) => [s.shard, s.file, s.first_prompt, s.prompt_count, s.token_count, s.bytes]), [
      [0, 'shard-00000-a.safetensors', 0, 32, 100, 1000],
      [1, 'shard-00001-a.safetensors', 32, 32, 101, 2000],
      [2, 'shard-00002-a.safetensors', 64, 6, 102, 3000],
    ]);
    assert.equal(shards.filter((s) => s.job_id === ids.running).map((s) => [s.shard, s.file]), [[0, 'shard-00000-b.safetensors']]);
  });

  it('a job no worker claimed, published again: its redispatched_at moves (the resumer waits a lease from it), its redispatches do not', async ({ store }) => {
    const jobId = newJob();
    const events = decided([
      { type: 'Submit', job: plan(jobId, 'cy', 600) },
      { type: 'Start', transport: 'inprocess', now: t(601) },
      { type: 'Redispatch', now: t(661), leaseMs, maxRedispatches: 3, reason: 'no worker claimed it within 60 s' },
    ]);
    assert.equal(events.map((e) => e.type), ['HarvestSubmitted', 'HarvestStarted', 'HarvestRepublished']);
    const rows = await applyTwice(store, harvestJobsProjection, events.map((e, i) => recorded(e, { streamId: harvestStream(jobId), streamVersion: i + 1 })), `SELECT status, redispatches, redispatched_at, worker_id FROM harvest_jobs WHERE job_id = '${jobId}'`);
    assert.equal(rows.map((r) => ({ ...r, redispatched_at: iso(r.redispatched_at) })), [{ status: 'running', redispatches: 0, redispatched_at: t(661), worker_id: null }]);
  });

  it('a finished job stays as it finished whichever of its events is applied again (none moves it back)', async ({ store }) => {
    const { ids, streams } = scenario('bea');
    const jobId = ids.succeeded;
    const events = streams[jobId].map((e, i) => recorded(e, { streamId: harvestStream(jobId), streamVersion: i + 1 }));
    const query = `SELECT status, started_at, worker_id, lease_until, finished_at, shards_done, tokens_done::int, last_progress_at FROM harvest_jobs WHERE job_id = '${jobId}'`;
    const final = await applyTwice(store, harvestJobsProjection, events, query);
    for (const event of events) {
      await store.transaction((tx) => harvestJobsProjection.apply([event], tx));
      const { rows } = await store.query<Record<string, unknown>>(query);
      assert.equal(JSON.parse(JSON.stringify(rows)), final, `${event.type} applied again`);
    }
  });

  it('the query helpers: one job, a user\'s jobs newest first (paged), the jobs the resumer looks at, a job\'s shards', async ({ store }) => {
    const user = `u-${randomBytes(4).toString('hex')}`;
    const { ids, events } = scenario(user);
    await applyTwice(store, harvestJobsProjection, events, 'SELECT 1');
    const row = await harvestJobRow(store, ids.running);
    assert.ok(row);
    assert.equal(
      { ...row, submittedAt: row.submittedAt.toISOString(), startedAt: row.startedAt?.toISOString(), lastProgressAt: row.lastProgressAt.toISOString(), leaseUntil: row.leaseUntil?.toISOString(), redispatchedAt: row.redispatchedAt?.toISOString() },
      {
        jobId: ids.running, keyId: 'k1', keyPrefix: 'k1', userId: user, model: 'gpt2', checkpoint: 'main', status: 'running', promptCount: 70, shardCount: 3, shardSize: 32, batchSize: 8,
        layers: [0, 5, 11], estimatedTokens: 900, shardsDone: 1, promptsDone: 32, tokensDone: 100, bytesDone: 1000, submittedAt: t(100), startedAt: t(101), finishedAt: null,
        lastProgressAt: t(110), workerId: 'w-c', leaseUntil: t(300), redispatches: 1, redispatchedAt: t(200), errorCode: null, errorMessage: null, month: '2026-11', counted: true, manifestSha256: null,
      },
    );
    assert.is(await harvestJobRow(store, 'hj_none'), null);

    const newestFirst = [ids.pending, ids.cancelled, ids.startFailed, ids.running, ids.succeeded];
    assert.equal((await listHarvestJobs(store, { userId: user, limit: 10 })).map((r) => r.jobId), newestFirst);
    assert.equal((await listHarvestJobs(store, { userId: user, limit: 2 })).map((r) => r.jobId), newestFirst.slice(0, 2));
    assert.equal((await listHarvestJobs(store, { userId: user, limit: 2, before: ids.cancelled })).map((r) => r.jobId), newestFirst.slice(2, 4));
    assert.equal((await listHarvestJobs(store, { userId: user, limit: 10, before: new Date(t(300)) })).map((r) => r.jobId), newestFirst.slice(3));
    assert.equal(await listHarvestJobs(store, { userId: `${user}-other`, limit: 10 }), []);

    const resumable = (await resumableHarvestJobs(store)).filter((r) => Object.values(ids).includes(r.jobId));
    assert.equal(resumable.map((r) => [r.jobId, r.status, r.leaseUntil?.toISOString() ?? null, r.redispatches]), [
      [ids.running, 'running', t(300), 1],
      [ids.pending, 'pending', null, 0],
    ]);
    assert.equal((await harvestShardRows(store, ids.succeeded)).map((s) => [s.shard, s.first_prompt, s.prompt_count, s.token_count, s.bytes, s.sha256, s.writtenAt.toISOString()]), [
      [0, 0, 32, 100, 1000, sha('0'), t(10)],
      [1, 32, 32, 101, 2000, sha('1'), t(20)],
      [2, 64, 6, 102, 3000, sha('2'), t(30)],
    ]);
  });

  it('svc projections rebuild reproduces both tables row for row (live, then rebuilt, then rebuilt one event per batch)', async ({ store }) => {
    const user = `u-${randomBytes(4).toString('hex')}`;
    const { ids, streams } = scenario(user);
    const runner = new ProjectionRunner({ store, projections: [harvestJobsProjection], batchSize: 3, pollIntervalMs: 50 });
    await runner.start();
    // Appended stream by stream, through the store, while the runner follows the log
    for (const [jobId, events] of Object.entries(streams)) {
      for (const [i, event] of events.entries()) await store.append(harvestStream(jobId), [{ id: randomUUID(), type: event.type, data: event.data }], i);
    }
    await runner.caughtUp();
    const ours = Object.values(ids).map((id) => `'${id}'`).join(', ');
    const snapshot = async () => ({
      jobs: JSON.parse(JSON.stringify((await store.query(`SELECT * FROM harvest_jobs t WHERE job_id IN (${ours}) ORDER BY t::text`)).rows)),
      shards: JSON.parse(JSON.stringify((await store.query(`SELECT * FROM harvest_shards t WHERE job_id IN (${ours}) ORDER BY t::text`)).rows)),
    });
    const live = await snapshot();
    assert.equal([live.jobs.length, live.shards.length], [5, 4]);
    await runner.stop();
    let out = '';
    const io = { store, projections: [harvestJobsProjection], stdout: { write: (text: string) => (out += text) }, stderr: { write: () => true } };
    assert.is(await runProjectionsCommand(['rebuild', 'harvest_jobs'], io), 0);
    assert.match(out, 'rebuilt harvest_jobs:');
    assert.equal(await snapshot(), live);
    for (const size of [1, 2, 5]) {
      await new ProjectionRunner({ store, projections: [harvestJobsProjection], rebuildBatchSize: size }).rebuild('harvest_jobs');
      assert.equal(await snapshot(), live, `rebuilt in batches of ${size}`);
    }
    assert.ok(projections.includes(harvestJobsProjection), 'svc projections and the gateway run it');
  });

  it.run();
}
