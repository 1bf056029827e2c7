/**
 * The harvest-age-out workflow: a job whose slot its key's admission released as stale
 * (`HarvestSlotReleased`, reason `stale`: the quota decider's `harvestSlotFreed`) is aged out on its
 * own stream (`AgeOut`: failed `stale`, unless it ended meanwhile), so a job never runs without its
 * slot. Stateless: the command's id is derived from the job, and one sent again appends nothing.
 */
import type { EventOf, Workflow, WorkflowCommand, WorkflowInput } from '../src/event-sourcing/index.ts';
import { harvestQuotaEvents, harvestQuotaKeyOf, harvestStream, type HarvestSlotReleased } from '../events/harvest.ts';
import { harvestDecider, type HarvestCommand } from '../deciders/harvest.ts';

type Released = EventOf<typeof HarvestSlotReleased>;
type AgeOut = Extract<HarvestCommand, { type: 'AgeOut' }>;
export type HarvestAgeOutState = Readonly<Record<string, never>>;

const stateless: HarvestAgeOutState = {};

export const harvestAgeOutWorkflow: Workflow<Released, HarvestAgeOutState, AgeOut> = {
  name: 'harvest-age-out',
  inputs: harvestQuotaEvents,
  inputTypes: ['HarvestSlotReleased'],
  target: harvestDecider,
  instanceOf: (input: WorkflowInput<Released>) => harvestQuotaKeyOf(input.streamId) ?? input.streamId,
  initialState: () => stateless,
  decide(input): WorkflowCommand<AgeOut>[] {
    if (input.data.reason !== 'stale') return [];
    const { job_id: jobId, at } = input.data;
    return [{ stream: harvestStream(jobId), commandId: `age-out:${jobId}`, command: { type: 'AgeOut', now: at } }];
  },
  evolve: (state) => state,
};
