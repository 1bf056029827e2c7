/** Every decider: the rules of one stream each, pure (the workflows that drive them are in ../workflows). */
export * from './key.ts';
export * from './meter.ts';
export * from './spend.ts';
export * from './backend.ts';
export * from './harvest.ts';
export * from './harvest-quota.ts';
