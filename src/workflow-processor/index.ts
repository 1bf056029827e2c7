/** Workflows follow the log: the processor that drives them from their checkpoints. */
export { WorkflowProcessor, checkpointOf, type WorkflowProcessorOptions } from './processor.ts';
