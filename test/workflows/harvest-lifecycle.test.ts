/**
 * The harvest lifecycle's workflows beside harvest-slots, given / when / then: harvest-age-out (a slot
 * its key's admission released as stale ages the job out on its stream) and harvest-orphans (each
 * admission checked once, a minute after it, against its job as its stream then holds it: the quota
 * decider frees the slot of a job never recorded). Then the orphan check driven from the log by the
 * real workflow processor on a real store (PGlite always, PostgreSQL when DATABASE_URL is set): a
 * submit that died between its admission and its job's record leaves a slot that comes back.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomBytes } from 'node:crypto';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { WorkflowProcessor } from '../../src/processors/index.ts';
import { scheduleInput, type WorkflowInput } from '../../src/event-sourcing/index.ts';
import type { EventStore } from '../../src/store/index.ts';
import { harvestAgeOutWorkflow, HarvestAdmissionDue, harvestOrphansWorkflow, type HarvestOrphansInput } from '../../workflows/index.ts';
import { harvestDecider } from '../../deciders/harvest.ts';
import { harvestOrphanAdmissionMs, harvestQuotaDecider, type ObservedJob } from '../../deciders/harvest-quota.ts';
import { HarvestJobAdmitted, harvestQuotaStream, HarvestSlotReleased, harvestStream, type HarvestSubmittedData } from '../../events/harvest.ts';
import { adaptersUnderTest } from '../store/adapters.ts';
import { workflowSpecification } from '../support/workflow-specification.ts';
import { until } from '../support/until.ts';

const at = '2026-11-26T12:00:00.000Z';
const plus = (iso: string, ms: number) => new Date(Date.parse(iso) + ms).toISOString();
const key_id = 'k1';
let ids = 0;

const unit = suite('harvest lifecycle workflows');

// --- harvest-age-out -------------------------------------------------------------------------------

const ageOut = workflowSpecification(harvestAgeOutWorkflow);
const releasedInput = (jobId: string, reason: 'ended' | 'orphan' | 'stale' | undefined, counted = true) =>
  ({ ...HarvestSlotReleased({ job_id: jobId, counted, ...(reason ? { reason } : {}), at }), id: `e${++ids}`, streamId: harvestQuotaStream(key_id) }) as WorkflowInput<ReturnType<typeof HarvestSlotReleased>>;

unit('a slot released as stale ages its job out on the job\'s stream, at the release\'s time; one instance per key', () => {
  const when = ageOut.given([]).when(releasedInput('hj_a', 'stale'));
  when.then([{ stream: harvestStream('hj_a'), commandId: 'age-out:hj_a', command: { type: 'AgeOut', now: at } }]);
  assert.is(when.instance(), key_id);
});

unit('a slot released because its job ended, or was never recorded, or by an older release without a reason: nothing', () => {
  ageOut.given([]).when(releasedInput('hj_b', 'ended')).thenNothing();
  ageOut.given([]).when(releasedInput('hj_c', 'orphan', false)).thenNothing();
  ageOut.given([]).when(releasedInput('hj_d', undefined)).thenNothing();
});

// --- harvest-orphans -------------------------------------------------------------------------------

const observed = (jobId: string, status: ObservedJob['status'], counted = status !== 'none'): ObservedJob => ({ jobId, status, counted, lastProgressAt: null });
const orphans = workflowSpecification(harvestOrphansWorkflow({ read: async (jobId) => observed(jobId, 'none') }));
const admittedInput = (jobId: string, when = at) =>
  ({ ...HarvestJobAdmitted({ job_id: jobId, month: '2026-11', at: when }), id: `e${++ids}`, streamId: harvestQuotaStream(key_id) }) as WorkflowInput<HarvestOrphansInput>;
const due = plus(at, harvestOrphanAdmissionMs);
const release = (jobId: string, job: ObservedJob, now = due) => ({ stream: harvestQuotaStream(key_id), commandId: `orphan:${jobId}`, command: { type: 'Release' as const, job, now } });

unit('an admission schedules its check a minute after it, on its job\'s instance', () => {
  const when = orphans.given([]).when(admittedInput('hj_e'));
  when.then([scheduleInput(due, 'orphan:hj_e', HarvestAdmissionDue({ job_id: 'hj_e', key_id, admitted_at: at }))]);
  assert.is(when.instance(), 'hj_e');
});

unit('the check fires once, at its time, and gives the quota decider the job as its stream then holds it', () => {
  const given = orphans.given([admittedInput('hj_f')]);
  given.whenTick(plus(due, -1), observed('hj_f', 'none')).thenNothing();
  const tick = given.whenTick(due, observed('hj_f', 'none'));
  tick.thenFired(['orphan:hj_f']);
  tick.then([release('hj_f', observed('hj_f', 'none'))]);
  tick.andThen().whenTick(plus(due, 60_000), observed('hj_f', 'none')).thenNothing();
  // A recorded job goes to the decider as it is (which keeps its slot); a late tick at its own time.
  given.whenTick(plus(due, 5_000), observed('hj_f', 'running')).then([release('hj_f', observed('hj_f', 'running'), plus(due, 5_000))]);
});

unit.run();

// --- driven from the log -------------------------------------------------------------------------

const newKey = () => randomBytes(6).toString('hex');
const newJob = () => `hj_${randomBytes(12).toString('hex')}`;

function plan(jobId: string, keyId: string, now: string): HarvestSubmittedData {
  return { job_id: jobId, key_id: keyId, key_prefix: keyId, user_id: 'u', model: 'gpt2', checkpoint: 'main', prompt_count: 1, estimated_tokens: 1, layers: [0], d_model: 8, shard_size: 32, batch_size: 1, shard_count: 1, input_sha256: 'a'.repeat(64), month: now.slice(0, 7), at: now };
}

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore }>(`harvest orphan admissions released from the log (${adapter.name})`);
  it.before(async (context) => {
    context.store = await adapter.open({ pollIntervalMs: 100 });
  });
  it.after(async (context) => {
    await context.store?.close();
    await adapter.cleanup();
  });

  it('a submit that died between its admission and its record: the slot and the count come back at the check; a recorded job keeps its slot', async ({ store }) => {
    const keyId = newKey();
    const handler = new CommandHandler({ store });
    const now = new Date().toISOString();
    const admit = (jobId: string) =>
      handler.handle(harvestQuotaStream(keyId), { type: 'Admit', jobId, now, monthlyQuota: 2, runningCap: 2, staleAfterMs: 3_600_000, jobs: [] }, harvestQuotaDecider);
    const orphan = newJob();
    const recorded = newJob();
    assert.ok((await admit(orphan)).accepted);
    assert.ok((await admit(recorded)).accepted);
    assert.ok((await handler.handle(harvestStream(recorded), { type: 'Submit', job: plan(recorded, keyId, now) }, harvestDecider)).accepted);
    // Both slots and the whole quota are taken.
    const third = await handler.handle(harvestQuotaStream(keyId), { type: 'Admit', jobId: newJob(), now, monthlyQuota: 2, runningCap: 0, staleAfterMs: 3_600_000, jobs: [] }, harvestQuotaDecider);
    assert.is(third.accepted ? null : third.rejection.rejected, 'harvest_quota_exceeded');

    const errors: unknown[] = [];
    const read = async (jobId: string): Promise<ObservedJob> => {
      const { status, counted, lastProgressAt } = (await new CommandHandler({ store }).load(harvestStream(jobId), harvestDecider, { fresh: true })).state;
      return { jobId, status, counted, lastProgressAt };
    };
    // The processor's clock a minute on: the checks are due at once.
    const processor = new WorkflowProcessor({
      store,
      handler,
      workflows: [harvestOrphansWorkflow({ read })],
      pollIntervalMs: 100,
      now: () => new Date(Date.now() + harvestOrphanAdmissionMs + 1_000),
      onError: (_w, e) => errors.push(e),
    });
    await processor.start();
    try {
      const quota = async () => (await new CommandHandler({ store }).load(harvestQuotaStream(keyId), harvestQuotaDecider, { fresh: true })).state;
      await until('the orphan admission released', async () => !(await quota()).active.has(orphan), 30_000, 50);
      await processor.caughtUp();
      const state = await quota();
      assert.equal([...state.active.keys()], [recorded], 'the recorded job keeps its slot');
      assert.is(state.counted, 1, 'the orphan no longer counts');
      const releases = (await store.readStream(harvestQuotaStream(keyId))).events.filter((e) => e.type === 'HarvestSlotReleased').map((e) => e.data);
      assert.equal(releases, [{ job_id: orphan, counted: false, reason: 'orphan', at: (releases[0] as { at: string }).at }]);
      const next = await handler.handle(harvestQuotaStream(keyId), { type: 'Admit', jobId: newJob(), now: new Date().toISOString(), monthlyQuota: 2, runningCap: 2, staleAfterMs: 3_600_000, jobs: [] }, harvestQuotaDecider);
      assert.ok(next.accepted, 'a following submit is admitted');
      assert.equal(errors, []);
    } finally {
      await processor.stop();
    }
  });

  it.run();
}
