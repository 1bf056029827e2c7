/**
 * The harvest resumer (`resumeHarvests`): a tick and the pending and running jobs in, `Redispatch`
 * commands with ids naming the lapse out; and those commands through the real decider, so the same
 * lapse seen twice (a view that lags) redispatches once.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { resumeHarvests, type ResumableHarvest } from '../../workflows/timed-workflows.ts';
import { harvestDecider } from '../../deciders/harvest.ts';
import { HarvestClaimed, HarvestStarted, harvestStream, HarvestSubmitted } from '../../events/harvest.ts';
import { foldEvents } from '../../src/event-sourcing/index.ts';
import type { ResumableHarvestRow } from '../../projections/harvest-jobs.ts';

const it = suite('harvest resumer');
const t0 = Date.parse('2026-11-26T12:00:00.000Z');
const at = (s: number) => new Date(t0 + s * 1000);
const iso = (s: number) => at(s).toISOString();
const leaseMs = 60_000;
const maxRedispatches = 3;
const now = iso(1000);

const job = (jobId: string, over: Partial<ResumableHarvest>): ResumableHarvest => ({ jobId, status: 'running', leaseUntil: null, startedAt: at(1), submittedAt: at(0), redispatches: 0, redispatchedAt: null, ...over });
const redispatch = (jobId: string, commandId: string, reason: string) => ({
  stream: harvestStream(jobId),
  commandId,
  command: { type: 'Redispatch' as const, now, leaseMs, maxRedispatches, reason },
});
const resume = (jobs: ResumableHarvest[]) => resumeHarvests({ now }, { jobs, leaseMs, maxRedispatches });

it('a running job whose claim lapsed is redispatched, under an id naming the attempt it would be', () => {
  assert.equal(resume([job('hj_a', { leaseUntil: at(999), redispatches: 1 })]), [redispatch('hj_a', 'redispatch:hj_a:2', `the claim's lease lapsed at ${iso(999)}`)]);
  assert.equal(resume([job('hj_a', { leaseUntil: at(1000) })]).length, 1, 'a lease ending now has lapsed');
});

it('a running job whose claim still stands is left alone', () => {
  assert.equal(resume([job('hj_b', { leaseUntil: at(1001) })]), []);
});

it('an unclaimed running job waits a lease from its start, or from its last redispatch, under an id naming that dispatch', () => {
  assert.equal(resume([job('hj_c', { startedAt: at(940) })]), [redispatch('hj_c', `republish:hj_c:${iso(940)}`, 'no worker claimed it within 60 s')]);
  assert.equal(resume([job('hj_c', { startedAt: at(941) })]), []);
  assert.equal(resume([job('hj_d', { startedAt: at(1), redispatches: 2, redispatchedAt: at(950) })]), []);
  assert.equal(resume([job('hj_d', { startedAt: at(1), redispatches: 2, redispatchedAt: at(940) })]), [redispatch('hj_d', `republish:hj_d:${iso(940)}`, 'no worker claimed it within 60 s')]);
});

it('through the decider: an unclaimed job is published again once a lease (not a lost worker), each time under a new id', () => {
  const jobId = 'hj_u';
  const submitted = HarvestSubmitted({ job_id: jobId, key_id: 'k', key_prefix: 'k', user_id: 'u', model: 'm', checkpoint: 'c', prompt_count: 1, estimated_tokens: 1, layers: [0], d_model: null, shard_size: 1, batch_size: 1, shard_count: 1, input_sha256: 'a'.repeat(64), month: '2026-11', at: iso(0) });
  let state = foldEvents(harvestDecider, harvestDecider.initialState(), [submitted, HarvestStarted({ job_id: jobId, key_id: 'k', transport: 'inprocess', at: iso(1) })]);
  const ids: string[] = [];
  for (let round = 0; round < 5; round++) {
    const tick = iso(1 + (round + 1) * 60);
    const [command] = resumeHarvests({ now: tick }, { jobs: [job(jobId, { startedAt: at(1), redispatchedAt: state.redispatchedAt ? new Date(state.redispatchedAt) : null })], leaseMs, maxRedispatches });
    ids.push(command.commandId);
    const out = harvestDecider.decide(command.command, state);
    const decided = (Array.isArray(out) ? out : [out]) as { type: string }[];
    assert.equal(decided.map((e) => e.type), ['HarvestRepublished']);
    state = foldEvents(harvestDecider, state, decided as never);
  }
  assert.is(new Set(ids).size, 5, 'a new id each lease');
  assert.equal([state.status, state.redispatches, state.lostInARow], ['running', 0, 0], 'never failed for waiting');
});

it('a pending job never started within a lease is sent to be started; a fresh one is not', () => {
  assert.equal(resume([job('hj_e', { status: 'pending', startedAt: null, submittedAt: at(940) })]), [redispatch('hj_e', 'redispatch:hj_e:start', 'never started')]);
  assert.equal(resume([job('hj_e', { status: 'pending', startedAt: null, submittedAt: at(941) })]), []);
});

it('a job the view shows ended is left alone', () => {
  assert.equal(resume([job('hj_f', { status: 'failed', leaseUntil: at(1) })]), []);
});

it('the same tick decided twice sends the same commands', () => {
  const jobs = [job('hj_a', { leaseUntil: at(999) }), job('hj_e', { status: 'pending', startedAt: null })];
  assert.equal(resume(jobs), resume(jobs));
});

it("the projection's rows are the resumer's view as they are", () => {
  const row: ResumableHarvestRow = { jobId: 'hj_g', keyId: 'k', status: 'running', submittedAt: at(0), startedAt: at(1), leaseUntil: at(5), redispatches: 0, redispatchedAt: null, lastProgressAt: at(1) };
  assert.equal(resumeHarvests({ now }, { jobs: [row], leaseMs, maxRedispatches }).map((c) => c.commandId), ['redispatch:hj_g:1']);
});

it('through the decider: the command redispatches once; a lagging view sends the same id again, the decider judging on the stream', () => {
  const jobId = 'hj_h';
  const submitted = HarvestSubmitted({ job_id: jobId, key_id: 'k', key_prefix: 'k', user_id: 'u', model: 'm', checkpoint: 'c', prompt_count: 1, estimated_tokens: 1, layers: [0], d_model: null, shard_size: 1, batch_size: 1, shard_count: 1, input_sha256: 'a'.repeat(64), month: '2026-11', at: iso(0) });
  const events = [submitted, HarvestStarted({ job_id: jobId, key_id: 'k', transport: 'inprocess', at: iso(1) }), HarvestClaimed({ job_id: jobId, claim_id: 'c1', worker_id: 'w', next_shard: 0, lease_until: iso(61), at: iso(1) })];
  const view = [job(jobId, { leaseUntil: at(61) })];
  const [first] = resume(view);
  let state = foldEvents(harvestDecider, harvestDecider.initialState(), events);
  const decided = harvestDecider.decide(first.command, state);
  assert.ok(Array.isArray(decided) ? decided.length === 1 : 'type' in decided, 'redispatched');
  state = foldEvents(harvestDecider, state, Array.isArray(decided) ? decided : [decided as never]);
  assert.is(state.redispatches, 1);
  const [again] = resume(view); // the projection has not seen the redispatch yet
  assert.is(again.commandId, first.commandId, 'the same lapse, the same id: the command handler appends nothing twice');
  assert.equal(harvestDecider.decide(again.command, state), [], 'and the decider itself finds nothing lapsed yet');
});

it.run();
