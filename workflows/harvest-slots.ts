/**
 * The harvest-slots workflow: a job that ended (succeeded, failed, cancelled, or whose start failed)
 * gives its running slot back on its key's quota stream; one whose start failed gives its month's
 * quota back too (it never engaged a GPU). One job ends once, so there is nothing to remember: the
 * command's id is derived from the job, and a release sent again (after a crash) appends nothing.
 * The quota decider judges the release with its one rule (`harvestSlotFreed`); whichever comes
 * first, this release or the key's next Admit that finds the job ended, frees the slot, and the other
 * appends nothing.
 */
import type { Workflow, WorkflowCommand, WorkflowInput } from '../src/event-sourcing/index.ts';
import { harvestEvents, harvestQuotaStream, type HarvestEnded } from '../events/harvest.ts';
import { harvestQuotaDecider, type HarvestQuotaCommand, type ObservedJob } from '../deciders/harvest-quota.ts';

type Release = Extract<HarvestQuotaCommand, { type: 'Release' }>;
export type HarvestSlotsState = Readonly<Record<string, never>>;

const stateless: HarvestSlotsState = {};

const statusOf: Record<HarvestEnded['type'], ObservedJob['status']> = {
  HarvestSucceeded: 'succeeded',
  HarvestFailed: 'failed',
  HarvestCancelled: 'cancelled',
  HarvestStartFailed: 'failed',
};

/** The ended job as its stream holds it after `input` (a failed start never counts). */
export const endedJob = (input: HarvestEnded): ObservedJob => ({
  jobId: input.data.job_id,
  status: statusOf[input.type],
  counted: input.type !== 'HarvestStartFailed',
  lastProgressAt: null,
});

export const harvestSlotsWorkflow: Workflow<HarvestEnded, HarvestSlotsState, Release> = {
  name: 'harvest-slots',
  inputs: harvestEvents,
  inputTypes: ['HarvestSucceeded', 'HarvestFailed', 'HarvestCancelled', 'HarvestStartFailed'],
  target: harvestQuotaDecider,
  instanceOf: (input: WorkflowInput<HarvestEnded>) => input.data.key_id,
  initialState: () => stateless,
  decide(input): WorkflowCommand<Release>[] {
    const { job_id: jobId, key_id: keyId, at } = input.data;
    return [{ stream: harvestQuotaStream(keyId), commandId: `release:${jobId}`, command: { type: 'Release', job: endedJob(input), now: at } }];
  },
  evolve: (state) => state,
};
