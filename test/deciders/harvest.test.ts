/**
 * The harvest decider, given / when / then: every command and every rejection; a terminal state is
 * never overwritten, a superseded claim records nothing, shards come in plan order (a repeat of the
 * last record appends nothing), age-out and redispatch only on a stale job.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { harvestDecider, harvestDispatched, harvestLeaseLapsed, harvestStale, plannedShard, type HarvestCommand } from '../../deciders/harvest.ts';
import {
  type HarvestShard,
  HarvestCancelled,
  HarvestClaimed,
  HarvestClaimRenewed,
  HarvestFailed,
  HarvestFilesRemoved,
  harvestJobOf,
  harvestMessageMax,
  HarvestRedispatched,
  HarvestRepublished,
  HarvestShardWritten,
  HarvestStarted,
  HarvestStartFailed,
  harvestStream,
  HarvestSubmitted,
  HarvestSucceeded,
  type HarvestEvent,
  type HarvestSubmittedData,
} from '../../events/harvest.ts';
import { foldEvents } from '../../src/event-sourcing/index.ts';
import { deciderSpecification } from '../support/decider-specification.ts';

const it = suite('harvest decider');
const spec = deciderSpecification(harvestDecider);
const t0 = '2026-11-26T12:00:00.000Z';
const at = (seconds: number) => new Date(Date.parse(t0) + seconds * 1000).toISOString();
const leaseMs = 60_000;
const job_id = 'hj_0123456789abcdefghijklmn';
const key_id = '0c8190d112da';
const sha = (c: string) => c.repeat(64);

/** 70 prompts in shards of 32: shards 0 and 1 hold 32, shard 2 holds 6. */
const job: HarvestSubmittedData = {
  job_id,
  key_id,
  key_prefix: key_id,
  user_id: 'ada',
  model: 'gpt2',
  checkpoint: 'main',
  prompt_count: 70,
  estimated_tokens: 900,
  layers: [0, 5, 11],
  d_model: 768,
  shard_size: 32,
  batch_size: 8,
  shard_count: 3,
  input_sha256: sha('a'),
  month: '2026-11',
  at: at(0),
};

const submitted = HarvestSubmitted(job);
const started = HarvestStarted({ job_id, key_id, transport: 'inprocess', at: at(1) });
const claimed = (claim: string, s: number, next = 0) => HarvestClaimed({ job_id, claim_id: claim, worker_id: `w-${claim}`, next_shard: next, lease_until: at(s + 60), at: at(s) });
const shardCommand = (claim: string, shard: number, s: number, over: Partial<HarvestShard> = {}): HarvestCommand => ({
  type: 'RecordShard',
  claimId: claim,
  record: {
    shard,
    file: `shard-${String(shard).padStart(5, '0')}-${claim}.safetensors`,
    first_prompt: plannedShard(job, shard).firstPrompt,
    prompt_count: plannedShard(job, shard).promptCount,
    token_count: 100 + shard,
    bytes: 1000 * (shard + 1),
    sha256: sha(String(shard)),
    ...over,
  },
  now: at(s),
  leaseMs,
});
const written = (claim: string, shard: number, s: number) => {
  const { firstPrompt, promptCount } = plannedShard(job, shard);
  return HarvestShardWritten({
    job_id,
    claim_id: claim,
    shard,
    file: `shard-${String(shard).padStart(5, '0')}-${claim}.safetensors`,
    first_prompt: firstPrompt,
    prompt_count: promptCount,
    token_count: 100 + shard,
    bytes: 1000 * (shard + 1),
    sha256: sha(String(shard)),
    lease_until: at(s + 60),
    at: at(s),
  });
};
const succeed = (claimId: string | null, s: number): HarvestCommand => ({ type: 'Succeed', claimId, manifestSha256: sha('f'), manifestBytes: 2048, now: at(s) });
const fail = (claimId: string | null, s: number, code = 'capture_incomplete'): HarvestCommand => ({ type: 'Fail', code, message: 'the engine returned 2 of 3 layers', claimId, now: at(s) });
const cancel = (s: number): HarvestCommand => ({ type: 'Cancel', byKeyPrefix: 'ffeeddccbbaa', now: at(s) });
const ageOut = (s: number): HarvestCommand => ({ type: 'AgeOut', now: at(s) });
const failStart = (s: number, reason = 'spawn ENOENT'): HarvestCommand => ({ type: 'FailStart', jobId: job_id, keyId: key_id, reason, now: at(s) });
const redispatch = (s: number, maxRedispatches = 2): HarvestCommand => ({ type: 'Redispatch', now: at(s), leaseMs, maxRedispatches, reason: 'lease lapsed' });

const running = [submitted, started];
const claimedA = [...running, claimed('a', 2)];
const allWritten = [...claimedA, written('a', 0, 10), written('a', 1, 20), written('a', 2, 30)];
const succeeded = HarvestSucceeded({ job_id, key_id, claim_id: 'a', manifest_sha256: sha('f'), manifest_bytes: 2048, shard_count: 3, prompt_count: 70, token_count: 303, bytes: 6000, at: at(31) });
const failedEvent = HarvestFailed({ job_id, key_id, code: 'capture_incomplete', message: 'the engine returned 2 of 3 layers', at: at(31) });
const cancelledEvent = HarvestCancelled({ job_id, key_id, by_key_prefix: 'ffeeddccbbaa', at: at(31) });
const startFailed = HarvestStartFailed({ job_id, key_id, reason: 'spawn ENOENT', at: at(1) });
/** Every way a job ends, each with what came before it. */
const terminals: Record<string, HarvestEvent[]> = {
  succeeded: [...allWritten, succeeded],
  failed: [...claimedA, failedEvent],
  cancelled: [...running, cancelledEvent],
  start_failed: [submitted, startFailed],
};

it('streams: harvest-<jobId>, and a job id read back from its stream (a quota stream is not a job)', () => {
  assert.is(harvestStream(job_id), `harvest-${job_id}`);
  assert.is(harvestJobOf(harvestStream(job_id)), job_id);
  assert.is(harvestJobOf(`harvest-quota-${key_id}`), null);
});

it('Submit makes a pending job, once; a plan whose shard count does not follow from the prompts is a bug', () => {
  spec.given([]).when({ type: 'Submit', job }).then([submitted]);
  spec.given([]).when({ type: 'Submit', job }).thenState((s) => {
    assert.is(s.status, 'pending');
    assert.is(s.counted, true);
    assert.is(s.lastProgressAt, at(0));
  });
  spec.given([submitted]).when({ type: 'Submit', job }).thenRejects('job_exists');
  assert.throws(() => harvestDecider.decide({ type: 'Submit', job: { ...job, shard_count: 2 } }, harvestDecider.initialState()), /shard_count/);
});

it('every command but Submit and FailStart on a job that does not exist: no_such_job', () => {
  const commands: HarvestCommand[] = [
    { type: 'Start', transport: 'inprocess', now: at(1) },
    { type: 'Claim', claimId: 'a', workerId: 'w', now: at(1), leaseMs },
    { type: 'RenewClaim', claimId: 'a', now: at(1), leaseMs },
    shardCommand('a', 0, 1),
    succeed(null, 1),
    fail(null, 1),
    cancel(1),
    ageOut(1),
    redispatch(1),
  ];
  for (const command of commands) spec.given([]).when(command).thenRejects('no_such_job');
});

it('Start: pending becomes running; a second start appends nothing; an ended job is refused', () => {
  spec.given([submitted]).when({ type: 'Start', transport: 'inprocess', now: at(1) }).then([started]);
  spec.given(running).when({ type: 'Start', transport: 'postgres', now: at(2) }).thenNothing();
  for (const events of Object.values(terminals)) spec.given(events).when({ type: 'Start', transport: 'inprocess', now: at(40) }).thenRejects('job_finished');
});

it('FailStart: a pending job fails uncounted (its reason cut to length); a started one is refused, an ended one too', () => {
  spec.given([submitted]).when(failStart(1)).then([startFailed]);
  spec.given([submitted, startFailed]).when({ type: 'Start', transport: 'x', now: at(2) }).thenRejects('job_finished');
  spec.given([submitted]).when(failStart(1)).thenState((s) => {
    assert.equal([s.status, s.counted, s.error], ['failed', false, { code: 'start_failed', message: 'spawn ENOENT' }]);
  });
  spec.given([submitted]).when(failStart(1, 'x'.repeat(harvestMessageMax + 10))).thenState((s) => assert.is(s.error?.message.length, harvestMessageMax));
  spec.given(running).when(failStart(2, 'late')).thenRejects('not_pending');
  for (const events of Object.values(terminals)) spec.given(events).when(failStart(40, 'late')).thenRejects('job_finished');
});

it('FailStart on a job never recorded (its submit failed before Submit): failed uncounted, under the key it was admitted for; a later Submit is refused', () => {
  spec.given([]).when(failStart(1, 'disk full')).then([HarvestStartFailed({ job_id, key_id, reason: 'disk full', at: at(1) })]);
  spec.given([]).when(failStart(1, 'disk full')).thenState((s) => assert.equal([s.status, s.counted, s.job], ['failed', false, null]));
  spec.given([HarvestStartFailed({ job_id, key_id, reason: 'disk full', at: at(1) })]).when({ type: 'Submit', job }).thenRejects('job_exists');
  spec.given([HarvestStartFailed({ job_id, key_id, reason: 'disk full', at: at(1) })]).when(failStart(2)).thenRejects('no_such_job');
});

it('Claim: a running job is claimed from the next unwritten shard, superseding any claim; the same claim again appends nothing', () => {
  spec.given(running).when({ type: 'Claim', claimId: 'a', workerId: 'w-a', now: at(2), leaseMs }).then([claimed('a', 2)]);
  spec.given([...claimedA, written('a', 0, 10)]).when({ type: 'Claim', claimId: 'b', workerId: 'w-b', now: at(70), leaseMs }).then([claimed('b', 70, 1)]);
  spec.given(claimedA).when({ type: 'Claim', claimId: 'a', workerId: 'w-a', now: at(3), leaseMs }).thenNothing();
  spec.given([submitted]).when({ type: 'Claim', claimId: 'a', workerId: 'w-a', now: at(2), leaseMs }).thenRejects('not_started');
  for (const events of Object.values(terminals)) spec.given(events).when({ type: 'Claim', claimId: 'z', workerId: 'w', now: at(40), leaseMs }).thenRejects('job_finished');
});

it('RenewClaim: the current claim moves its lease; a superseded one is refused (the worker stops)', () => {
  spec.given(claimedA).when({ type: 'RenewClaim', claimId: 'a', now: at(30), leaseMs }).then([HarvestClaimRenewed({ job_id, claim_id: 'a', lease_until: at(90), at: at(30) })]);
  spec.given([...claimedA, claimed('b', 70)]).when({ type: 'RenewClaim', claimId: 'a', now: at(71), leaseMs }).thenRejects('claim_superseded', { current_claim_id: 'b' });
  spec.given(running).when({ type: 'RenewClaim', claimId: 'a', now: at(3), leaseMs }).thenRejects('claim_superseded');
  spec.given([submitted]).when({ type: 'RenewClaim', claimId: 'a', now: at(3), leaseMs }).thenRejects('not_started');
  for (const events of Object.values(terminals)) spec.given(events).when({ type: 'RenewClaim', claimId: 'a', now: at(40), leaseMs }).thenRejects('job_finished');
});

it('RecordShard: the next shard of the plan is recorded and renews the lease; the last shard holds the remainder', () => {
  spec.given(claimedA).when(shardCommand('a', 0, 10)).then([written('a', 0, 10)]);
  spec.given([...claimedA, written('a', 0, 10), written('a', 1, 20)]).when(shardCommand('a', 2, 30)).then([written('a', 2, 30)]);
  assert.equal(plannedShard(job, 2), { firstPrompt: 64, promptCount: 6 });
  spec.given(claimedA).when(shardCommand('a', 0, 10)).thenState((s) => {
    assert.is(s.claim?.leaseUntil, at(70), 'recording a shard renews the lease');
    assert.is(s.lastProgressAt, at(10));
    assert.is(s.shards.length, 1);
  });
});

it('RecordShard sent again (a lost acknowledgement) appends nothing, even once the job has ended', () => {
  spec.given([...claimedA, written('a', 0, 10)]).when(shardCommand('a', 0, 11)).thenNothing();
  spec.given([...allWritten, succeeded]).when(shardCommand('a', 2, 40)).thenNothing();
});

it('RecordShard out of order is refused: a gap, a shard again with another file or hash, prompts off the plan, a shard past the plan', () => {
  spec.given(claimedA).when(shardCommand('a', 1, 10)).thenRejects('shard_out_of_order', { expected_shard: 0 });
  spec.given([...claimedA, written('a', 0, 10)]).when(shardCommand('a', 0, 11, { sha256: sha('9') })).thenRejects('shard_out_of_order', { expected_shard: 1 });
  spec.given(claimedA).when(shardCommand('a', 0, 10, { prompt_count: 31 })).thenRejects('shard_out_of_order', { expected_prompt_count: 32 });
  spec.given(claimedA).when(shardCommand('a', 0, 10, { first_prompt: 1 })).thenRejects('shard_out_of_order', { expected_first_prompt: 0 });
  spec.given(allWritten).when(shardCommand('a', 3, 40, { first_prompt: 96, prompt_count: 1 })).thenRejects('shard_out_of_order', { expected_shard: null });
});

it('a superseded claim cannot record a shard (a zombie worker), nor can a job not started or ended', () => {
  const takenOver = [...claimedA, written('a', 0, 10), claimed('b', 80, 1)];
  spec.given(takenOver).when(shardCommand('a', 1, 81)).thenRejects('claim_superseded', { current_claim_id: 'b' });
  spec.given(takenOver).when(shardCommand('b', 1, 82)).then([written('b', 1, 82)]);
  spec.given([submitted]).when(shardCommand('a', 0, 10)).thenRejects('not_started');
  spec.given([...claimedA, failedEvent]).when(shardCommand('a', 0, 40)).thenRejects('job_finished');
});

it('Succeed: once every shard is recorded, with the totals summed from the shards; again: nothing', () => {
  spec.given(allWritten).when(succeed('a', 31)).then([succeeded]);
  spec.given(allWritten).when(succeed(null, 31)).then([HarvestSucceeded({ ...succeeded.data, claim_id: null })]);
  spec.given([...allWritten, succeeded]).when(succeed('a', 32)).thenNothing();
});

it('Succeed is refused with shards missing, for a superseded claim, before the start, and after another ending', () => {
  spec.given([...claimedA, written('a', 0, 10)]).when(succeed('a', 31)).thenRejects('shards_missing', { recorded: 1, expected: 3 });
  spec.given([...allWritten, claimed('b', 80, 3)]).when(succeed('a', 81)).thenRejects('claim_superseded');
  spec.given([submitted]).when(succeed(null, 5)).thenRejects('not_started');
  for (const name of ['failed', 'cancelled', 'start_failed']) spec.given(terminals[name]).when(succeed(null, 40)).thenRejects('job_finished');
});

it('Fail: a pending or running job fails; again: nothing; a superseded claim or another ending is refused', () => {
  spec.given(claimedA).when(fail('a', 31)).then([failedEvent]);
  spec.given(claimedA).when(fail(null, 31)).then([failedEvent]);
  spec.given([submitted]).when(fail(null, 31)).then([failedEvent]);
  spec.given([...claimedA, failedEvent]).when(fail(null, 32)).thenNothing();
  spec.given([submitted, startFailed]).when(fail(null, 32)).thenNothing();
  spec.given([...claimedA, claimed('b', 80)]).when(fail('a', 81)).thenRejects('claim_superseded');
  for (const name of ['succeeded', 'cancelled']) spec.given(terminals[name]).when(fail(null, 40)).thenRejects('job_finished');
});

it('a racing terminal state is never overwritten: whichever ending came first stays', () => {
  const late: HarvestCommand[] = [succeed(null, 50), fail(null, 50), cancel(50), ageOut(50 * 60), redispatch(50 * 60, 0), { type: 'Start', transport: 'x', now: at(50) }, failStart(50, 'x')];
  for (const [name, events] of Object.entries(terminals)) {
    const before = foldEvents(harvestDecider, harvestDecider.initialState(), events);
    for (const command of late) {
      const decided = harvestDecider.decide(command, before);
      const appended = Array.isArray(decided) ? decided : 'rejected' in decided ? [] : [decided];
      assert.equal(appended, [], `${command.type} after ${name}`);
    }
    assert.is(before.status, name === 'start_failed' ? 'failed' : name);
  }
});

it('Cancel: a pending or running job is cancelled; an ended one is not cancellable', () => {
  spec.given(running).when(cancel(31)).then([cancelledEvent]);
  spec.given([submitted]).when(cancel(31)).then([cancelledEvent]);
  for (const events of Object.values(terminals)) spec.given(events).when(cancel(40)).thenRejects('not_cancellable');
});

it('AgeOut (its key\'s admission freed its slot as stale): a pending or running job fails stale, whatever came since; an ended one appends nothing', () => {
  const stale = (s: number, minutes: number) => HarvestFailed({ job_id, key_id, code: 'stale', message: `no progress for ${minutes} minutes; aged out`, at: at(s) });
  spec.given([submitted]).when(ageOut(30 * 60)).then([stale(30 * 60, 30)]);
  spec.given([...claimedA, written('a', 0, 600)]).when(ageOut(600 + 30 * 60 - 1)).then([stale(600 + 30 * 60 - 1, 29)]);
  spec.given([...claimedA, written('a', 0, 600)]).when(ageOut(300)).then([stale(300, 0)]);
  for (const events of Object.values(terminals)) spec.given(events).when(ageOut(100_000)).thenNothing();
});

it('harvestStale: a pending or running job without progress for the stale time (claims and renewals are not progress)', () => {
  const staleAfter = 30 * 60_000;
  const stateOf = (events: HarvestEvent[]) => foldEvents(harvestDecider, harvestDecider.initialState(), events);
  assert.ok(harvestStale(stateOf([submitted]), at(30 * 60), staleAfter));
  assert.not.ok(harvestStale(stateOf([submitted]), at(30 * 60 - 1), staleAfter));
  assert.not.ok(harvestStale(stateOf([...claimedA, written('a', 0, 600)]), at(600 + 30 * 60 - 1), staleAfter));
  const renewedOnly = [...claimedA, HarvestClaimRenewed({ job_id, claim_id: 'a', lease_until: at(1800), at: at(1740) })];
  assert.ok(harvestStale(stateOf(renewedOnly), at(1 + 30 * 60), staleAfter));
  for (const events of Object.values(terminals)) assert.not.ok(harvestStale(stateOf(events), at(100_000), staleAfter));
  assert.not.ok(harvestStale(harvestDecider.initialState(), at(100_000), staleAfter));
});

it('Redispatch: a running job whose claim lapsed is dispatched again, its claim cleared', () => {
  spec.given(claimedA).when(redispatch(62)).then([HarvestRedispatched({ job_id, attempt: 1, reason: 'lease lapsed', at: at(62) })]);
  spec.given(claimedA).when(redispatch(62)).thenState((s) => assert.equal([s.claim, s.redispatches, s.redispatchedAt], [null, 1, at(62)]));
  spec.given(claimedA).when(redispatch(61)).thenNothing();
  spec.given([...claimedA, HarvestClaimRenewed({ job_id, claim_id: 'a', lease_until: at(120), at: at(60) })]).when(redispatch(100)).thenNothing();
});

it('Redispatch: an unclaimed running job is waiting in its transport, not lost: published again a lease after its dispatch, never failed for it', () => {
  spec.given(running).when(redispatch(60)).thenNothing();
  spec.given(running).when(redispatch(61)).then([HarvestRepublished({ job_id, reason: 'lease lapsed', at: at(61) })]);
  spec.given(running).when(redispatch(100_000)).thenState((s) => assert.equal([s.status, s.redispatches, s.lostInARow, s.redispatchedAt], ['running', 0, 0, at(100_000)]));
  const republished = [...running, HarvestRepublished({ job_id, reason: 'r', at: at(61) })];
  spec.given(republished).when(redispatch(120)).thenNothing();
  spec.given(republished).when(redispatch(121)).then([HarvestRepublished({ job_id, reason: 'lease lapsed', at: at(121) })]);
  const once = [...claimedA, HarvestRedispatched({ job_id, attempt: 1, reason: 'lease lapsed', at: at(62) })];
  spec.given(once).when(redispatch(121)).thenNothing();
  spec.given(once).when(redispatch(122)).then([HarvestRepublished({ job_id, reason: 'lease lapsed', at: at(122) })]);
  spec.given(once).when(redispatch(100_000, 0)).thenState((s) => assert.equal([s.status, s.lostInARow], ['running', 1]));
  const state = foldEvents(harvestDecider, harvestDecider.initialState(), claimedA);
  assert.equal([harvestLeaseLapsed(state, at(61)), harvestLeaseLapsed(state, at(62))], [false, true]);
  assert.is(harvestLeaseLapsed(foldEvents(harvestDecider, harvestDecider.initialState(), once), at(100_000)), false);
});

it('harvestDispatched: a start, a redispatch or a republish is published on the transport; nothing else is', () => {
  assert.ok(harvestDispatched([started]));
  assert.ok(harvestDispatched([HarvestRedispatched({ job_id, attempt: 1, reason: 'r', at: at(62) })]));
  assert.ok(harvestDispatched([HarvestRepublished({ job_id, reason: 'r', at: at(61) })]));
  assert.not.ok(harvestDispatched([]));
  assert.not.ok(harvestDispatched([HarvestFailed({ job_id, key_id, code: 'worker_lost', message: 'm', at: at(62) })]));
});

const lostWorker = 'its worker was lost 3 times in a row without writing a shard (the job may crash its worker: a prompt too large for the engine\'s memory?); submit it again, or with a smaller batch_size';

it('Redispatch: a worker lost the most times in a row without a shard written fails the job (worker_lost); a shard written starts the count again', () => {
  const lost = (attempt: number, s: number) => HarvestRedispatched({ job_id, attempt, reason: 'r', at: at(s) });
  const twice = [...claimedA, lost(1, 62), claimed('b', 70), lost(2, 131), claimed('c', 140)];
  spec.given(twice).when(redispatch(201, 2)).then([HarvestFailed({ job_id, key_id, code: 'worker_lost', message: lostWorker, at: at(201) })]);
  spec.given(twice).when(redispatch(201, 3)).then([HarvestRedispatched({ job_id, attempt: 3, reason: 'lease lapsed', at: at(201) })]);
  // Progress between the losses: the count starts again, the attempt numbers go on (they name the commands).
  const progressed = [...claimedA, lost(1, 62), claimed('b', 70), written('b', 0, 80), lost(2, 141), claimed('c', 150)];
  spec.given(progressed).when(redispatch(211, 2)).then([HarvestRedispatched({ job_id, attempt: 3, reason: 'lease lapsed', at: at(211) })]);
  spec.given(claimedA).when(redispatch(62, 0)).then([HarvestFailed({ job_id, key_id, code: 'worker_lost', message: lostWorker.replace('3 times', '1 time'), at: at(62) })]);
});

it('Redispatch: a pending job never started within a lease is started by the resumer; a fresh one, or an ended one, is left alone', () => {
  spec.given([submitted]).when(redispatch(60)).then([HarvestStarted({ job_id, key_id, transport: 'resumer', at: at(60) })]);
  spec.given([submitted]).when(redispatch(59)).thenNothing();
  for (const events of Object.values(terminals)) spec.given(events).when(redispatch(100_000)).thenNothing();
});

it('RemoveFiles: a failed job\'s files by its owner, a failed or cancelled job\'s by the retention, once; never a live or succeeded job\'s', () => {
  const byOwner: HarvestCommand = { type: 'RemoveFiles', reason: 'owner', byKeyPrefix: 'ffeeddccbbaa', now: at(40) };
  const byRetention: HarvestCommand = { type: 'RemoveFiles', reason: 'retention', byKeyPrefix: null, now: at(40) };
  const removedByOwner = HarvestFilesRemoved({ job_id, key_id, reason: 'owner', by_key_prefix: 'ffeeddccbbaa', at: at(40) });
  const removedByRetention = HarvestFilesRemoved({ job_id, key_id, reason: 'retention', by_key_prefix: null, at: at(40) });
  spec.given(terminals.failed).when(byOwner).then([removedByOwner]);
  spec.given(terminals.start_failed).when(byOwner).then([removedByOwner]);
  spec.given(terminals.failed).when(byRetention).then([removedByRetention]);
  spec.given(terminals.cancelled).when(byRetention).then([removedByRetention]);
  spec.given(terminals.cancelled).when(byOwner).thenRejects('files_kept');
  spec.given(terminals.succeeded).when(byOwner).thenRejects('files_kept');
  spec.given(terminals.succeeded).when(byRetention).thenRejects('files_kept');
  spec.given(claimedA).when(byOwner).thenRejects('files_kept');
  spec.given([submitted]).when(byRetention).thenRejects('files_kept');
  // Once: a second removal, by either, appends nothing; the status stays failed.
  spec.given([...terminals.failed, removedByOwner]).when(byRetention).thenNothing();
  spec.given([...terminals.failed, removedByRetention]).when(byOwner).thenNothing();
  const state = foldEvents(harvestDecider, harvestDecider.initialState(), [...terminals.failed, removedByOwner]);
  assert.is(state.status, 'failed');
  assert.is(state.filesRemovedAt, at(40));
});

it.run();
