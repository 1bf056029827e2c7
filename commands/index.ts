/** Every decider. */
export * from './key.ts';
export * from './meter.ts';
export * from './spend.ts';
export * from './backend.ts';
export * from './carried-holds.ts';

import { carriedHoldsWorkflow } from './carried-holds.ts';

/** Every workflow the gateway drives (src/workflow-processor). */
export const workflows = [carriedHoldsWorkflow] as const;
export * from './timed-workflows.ts';
