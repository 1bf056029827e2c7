/** Every decider. */
export * from './key.ts';
export * from './meter.ts';
export * from './spend.ts';
export * from './backend.ts';
export * from './carried-holds.ts';
export * from './harvest.ts';
export * from './harvest-quota.ts';
export * from './harvest-slots.ts';

import { carriedHoldsWorkflow } from './carried-holds.ts';
import { harvestSlotsWorkflow } from './harvest-slots.ts';

/** Every workflow the gateway drives (src/workflow-processor). */
export const workflows = [carriedHoldsWorkflow, harvestSlotsWorkflow] as const;
export * from './timed-workflows.ts';
