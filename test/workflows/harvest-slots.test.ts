/**
 * The harvest-slots workflow: a job that ended gives its running slot back on its key's quota stream
 * (its month's quota too when its start failed). Given / when / then, then driven from the log by the
 * real workflow processor and command handler on a real store (PGlite always, PostgreSQL when
 * DATABASE_URL is set), a processor killed before its commit included.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomBytes } from 'node:crypto';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { WorkflowProcessor } from '../../src/processors/index.ts';
import { workflowStream, type WorkflowInput } from '../../src/event-sourcing/index.ts';
import type { EventStore } from '../../src/store/index.ts';
import { harvestSlotsWorkflow } from '../../workflows/harvest-slots.ts';
import { harvestDecider, type HarvestCommand } from '../../deciders/harvest.ts';
import { harvestQuotaDecider } from '../../deciders/harvest-quota.ts';
import { workflows } from '../../workflows/index.ts';
import {
  HarvestCancelled,
  HarvestFailed,
  harvestQuotaStream,
  HarvestStartFailed,
  harvestStream,
  HarvestSucceeded,
  type HarvestEnded,
  type HarvestSubmittedData,
} from '../../events/harvest.ts';
import { adaptersUnderTest } from '../store/adapters.ts';
import { workflowSpecification } from '../support/workflow-specification.ts';
import { until } from '../support/until.ts';
import { within } from '../support/within.ts';

const spec = workflowSpecification(harvestSlotsWorkflow);
const at = '2026-11-26T12:00:00.000Z';
const key_id = 'k1';
let ids = 0;
const input = (event: HarvestEnded) => ({ ...event, id: `e${++ids}`, streamId: harvestStream(event.data.job_id) }) as WorkflowInput<HarvestEnded>;
const release = (jobId: string, status: 'succeeded' | 'failed' | 'cancelled', counted: boolean) => ({
  stream: harvestQuotaStream(key_id),
  commandId: `release:${jobId}`,
  command: { type: 'Release' as const, job: { jobId, status, counted, lastProgressAt: null }, now: at },
});

const unit = suite('harvest-slots workflow');

unit('registered with the workflows the gateway drives', () => {
  assert.ok((workflows as readonly unknown[]).includes(harvestSlotsWorkflow));
});

unit('a job that succeeded, failed or was cancelled gives back its slot, still counted', () => {
  const sha = 'f'.repeat(64);
  spec.given([]).when(input(HarvestSucceeded({ job_id: 'hj_a', key_id, claim_id: 'c', manifest_sha256: sha, manifest_bytes: 1, shard_count: 1, prompt_count: 1, token_count: 1, bytes: 1, at }))).then([release('hj_a', 'succeeded', true)]);
  spec.given([]).when(input(HarvestFailed({ job_id: 'hj_b', key_id, code: 'stale', message: 'm', at }))).then([release('hj_b', 'failed', true)]);
  spec.given([]).when(input(HarvestCancelled({ job_id: 'hj_c', key_id, by_key_prefix: 'p', at }))).then([release('hj_c', 'cancelled', true)]);
});

unit('a job whose start failed gives back its slot uncounted (it never engaged a GPU)', () => {
  spec.given([]).when(input(HarvestStartFailed({ job_id: 'hj_d', key_id, reason: 'spawn ENOENT', at }))).then([release('hj_d', 'failed', false)]);
});

unit('one instance per key; stateless: what came before changes nothing', () => {
  const failed = input(HarvestFailed({ job_id: 'hj_e', key_id, code: 'stale', message: 'm', at }));
  const earlier = input(HarvestFailed({ job_id: 'hj_f', key_id, code: 'stale', message: 'm', at }));
  assert.is(spec.given([]).when(failed).instance(), key_id);
  spec.given([earlier]).when(failed).then([release('hj_e', 'failed', true)]);
  spec.given([earlier]).when(failed).thenState((s) => assert.equal(s, {}));
});

unit.run();

// --- driven from the log -------------------------------------------------------------------------

const t = (s: number) => new Date(Date.parse(at) + s * 1000).toISOString();
const newKey = () => randomBytes(6).toString('hex');
const newJob = () => `hj_${randomBytes(12).toString('hex')}`;

function plan(jobId: string, keyId: string): HarvestSubmittedData {
  return { job_id: jobId, key_id: keyId, key_prefix: keyId, user_id: 'u', model: 'gpt2', checkpoint: 'main', prompt_count: 1, estimated_tokens: 1, layers: [0], d_model: 8, shard_size: 32, batch_size: 1, shard_count: 1, input_sha256: 'a'.repeat(64), month: '2026-11', at: t(0) };
}

/** Admits and submits a job as the service does, then sends its job stream `commands`. */
async function jobThrough(handler: CommandHandler, keyId: string, commands: HarvestCommand[]): Promise<string> {
  const jobId = newJob();
  const admitted = await handler.handle(harvestQuotaStream(keyId), { type: 'Admit', jobId, now: t(0), monthlyQuota: 10, runningCap: 5, staleAfterMs: 3_600_000, jobs: [] }, harvestQuotaDecider);
  assert.ok(admitted.accepted);
  for (const command of [{ type: 'Submit', job: plan(jobId, keyId) } as HarvestCommand, ...commands]) {
    const outcome = await handler.handle(harvestStream(jobId), command, harvestDecider);
    assert.ok(outcome.accepted, `${command.type}: ${outcome.accepted ? '' : outcome.rejection.message}`);
  }
  return jobId;
}

const quotaOf = async (store: EventStore, keyId: string) => (await new CommandHandler({ store }).load(harvestQuotaStream(keyId), harvestQuotaDecider, { fresh: true })).state;
const releasesOf = async (store: EventStore, keyId: string) => (await store.readStream(harvestQuotaStream(keyId))).events.filter((e) => e.type === 'HarvestSlotReleased').map((e) => e.data as { job_id: string; counted: boolean });

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore }>(`harvest slots released from the log (${adapter.name})`);
  it.before(async (context) => {
    context.store = await adapter.open({ pollIntervalMs: 100 });
  });
  it.after(async (context) => {
    await context.store?.close();
    await adapter.cleanup();
  });

  const processorOn = (store: EventStore, errors: unknown[], handler = new CommandHandler({ store }), sources: { store: EventStore } = { store }) =>
    new WorkflowProcessor({ ...sources, handler, workflows: [harvestSlotsWorkflow], pollIntervalMs: 100, onError: (_w, e) => errors.push(e) });

  it('every ending frees its slot; only the failed start gives its month back', async ({ store }) => {
    const keyId = newKey();
    const handler = new CommandHandler({ store });
    const done = await jobThrough(handler, keyId, [{ type: 'Start', transport: 'inprocess', now: t(1) }, { type: 'Cancel', byKeyPrefix: keyId, now: t(2) }]);
    const startFailed = await jobThrough(handler, keyId, [{ type: 'FailStart', jobId: '', keyId, reason: 'spawn ENOENT', now: t(1) }]);
    const stillRunning = await jobThrough(handler, keyId, [{ type: 'Start', transport: 'inprocess', now: t(1) }]);
    const errors: unknown[] = [];
    const processor = processorOn(store, errors);
    await processor.start();
    await within(10_000, processor.caughtUp(), 'the workflow catching up');
    const quota = await quotaOf(store, keyId);
    assert.equal([...quota.active.keys()], [stillRunning], 'only the running job holds a slot');
    assert.is(quota.counted, 2, 'three admitted this month, one whose start failed');
    assert.equal((await releasesOf(store, keyId)).map((r) => [r.job_id, r.counted]).sort(), [[done, true], [startFailed, false]].sort());
    await processor.stop();
    assert.equal(errors, []);
  });

  it('a release that finds the slot freed by an admission told the job ended appends nothing', async ({ store }) => {
    const keyId = newKey();
    const handler = new CommandHandler({ store });
    const failed = await jobThrough(handler, keyId, [{ type: 'Fail', code: 'stale', message: 'aged out', claimId: null, now: t(5) }]);
    const next = newJob();
    const admitted = await handler.handle(harvestQuotaStream(keyId), { type: 'Admit', jobId: next, now: t(6), monthlyQuota: 10, runningCap: 5, staleAfterMs: 3_600_000, jobs: [{ jobId: failed, status: 'failed', counted: true, lastProgressAt: null }] }, harvestQuotaDecider);
    assert.ok(admitted.accepted);
    const errors: unknown[] = [];
    const processor = processorOn(store, errors);
    await processor.start();
    await within(10_000, processor.caughtUp(), 'the workflow catching up');
    assert.equal((await releasesOf(store, keyId)).map((r) => r.job_id), [failed], 'released once, by the admission');
    await processor.stop();
    assert.equal(errors, []);
  });

  it('a processor that dies after the release, before its commit: the next one sends it again, which appends nothing', async ({ store }) => {
    const keyId = newKey();
    const handler = new CommandHandler({ store });
    const jobId = await jobThrough(handler, keyId, [{ type: 'Start', transport: 'inprocess', now: t(1) }, { type: 'Fail', code: 'capture_incomplete', message: 'm', claimId: null, now: t(2) }]);
    const dyingErrors: unknown[] = [];
    const killedBeforeCommit = new Proxy(store, {
      get(target, property, receiver) {
        if (property === 'transaction') return async () => Promise.reject(new Error('killed before the commit'));
        const value = Reflect.get(target, property, receiver);
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
    const dying = processorOn(store, dyingErrors, new CommandHandler({ store }), { store: killedBeforeCommit });
    await dying.start();
    await until('the processor dying', async () => dyingErrors.length > 0, 10_000, 20);
    await dying.stop();
    assert.is((await releasesOf(store, keyId)).length, 1, 'the dead processor sent the release');

    const errors: unknown[] = [];
    const processor = processorOn(store, errors);
    await processor.start();
    await within(10_000, processor.caughtUp(), 'the next processor catching up');
    assert.equal((await releasesOf(store, keyId)).map((r) => r.job_id), [jobId], 'released once');
    const recorded = (await store.readStream(workflowStream(harvestSlotsWorkflow.name, keyId))).events.map((e) => e.type);
    assert.equal(recorded, ['WorkflowInputRecorded', 'WorkflowCommandSent'], 'the ending and its release, recorded once');
    assert.is((await quotaOf(store, keyId)).active.size, 0);
    await processor.stop();
    assert.equal(errors, []);
  });

  it.run();
}
