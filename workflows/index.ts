/** Every workflow: reactions to events and to the passing of time, each sending commands to a decider. */
export * from './carried-holds.ts';
export * from './harvest-slots.ts';
export * from './harvest-age-out.ts';
export * from './harvest-orphans.ts';
export * from './timed-workflows.ts';
export * from './periodic.ts';
export * from './breaker-half-open.ts';

import { carriedHoldsWorkflow } from './carried-holds.ts';
import { harvestSlotsWorkflow } from './harvest-slots.ts';

/**
 * The workflows the gateway drives (src/processors) whose commands go through the command handler;
 * the timers (the breakers' half-open, the periodic ones of timed-workflows.ts, the harvests'
 * orphan check) and the harvests' age-out come with the services that read their views and send
 * their commands (backends, metering, harvests).
 */
export const workflows = [carriedHoldsWorkflow, harvestSlotsWorkflow] as const;
