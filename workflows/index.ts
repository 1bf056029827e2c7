/** Every workflow: reactions to events and to the passing of time, each sending commands to a decider. */
export * from './carried-holds.ts';
export * from './harvest-slots.ts';
export * from './timed-workflows.ts';

import { carriedHoldsWorkflow } from './carried-holds.ts';
import { harvestSlotsWorkflow } from './harvest-slots.ts';

/** Every workflow the gateway drives (src/processors). */
export const workflows = [carriedHoldsWorkflow, harvestSlotsWorkflow] as const;
