/** Every decider. */
export * from './key.ts';
export * from './meter.ts';
export * from './spend.ts';
