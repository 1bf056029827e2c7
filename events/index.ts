/** Every stream category's events. */
export * from './key.ts';
export * from './meter.ts';
export * from './spend.ts';
export * from './backend.ts';
export * from './harvest.ts';
export * from './shapes.ts';
