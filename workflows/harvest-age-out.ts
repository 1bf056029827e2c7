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

/**
 * The age-out a slot release asks for: none unless it was released `stale`. The submit whose admission
 * released it sends it before answering (the contract ages stale jobs out during the submit); this
 * workflow sends it again after a crash in between, appending nothing when it was.
 */
export function ageOutOf(released: Released['data']): WorkflowCommand<AgeOut>[] {
  if (released.reason !== 'stale') return [];
  const { job_id: jobId, at } = released;
  return [{ stream: harvestStream(jobId), commandId: `age-out:${jobId}`, command: { type: 'AgeOut', now: at } }];
}

export const harvestAgeOutWorkflow: Workflow<Released, HarvestAgeOutState, AgeOut> = {
  name: 'harvest-age-out',
  inputs: harvestQuotaEvents,
  inputTypes: ['HarvestSlotReleased'],
  target: harvestDecider,
  instanceOf: (input: WorkflowInput<Released>) => harvestQuotaKeyOf(input.streamId) ?? input.streamId,
  initialState: () => stateless,
  decide: (input) => ageOutOf(input.data),
  evolve: (state) => state,
};
