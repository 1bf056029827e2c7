/** Every workflow: reactions to events and to the passing of time, each sending commands to a decider. */
export * from './carried-holds.ts';
export * from './harvest-slots.ts';
export * from './timed-workflows.ts';
export * from './periodic.ts';
export * from './breaker-half-open.ts';

import { carriedHoldsWorkflow } from './carried-holds.ts';
import { harvestSlotsWorkflow } from './harvest-slots.ts';
import { breakerHalfOpenWorkflow } from './breaker-half-open.ts';

/**
 * Every workflow the gateway drives (src/processors) that needs nothing but the log; the periodic ones
 * (timed-workflows.ts) are built by the services whose read models they read (metering, harvests).
 */
export const workflows = [carriedHoldsWorkflow, harvestSlotsWorkflow, breakerHalfOpenWorkflow] as const;
