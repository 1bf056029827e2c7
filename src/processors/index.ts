/**
 * What follows the log: the projection runner and the workflow processor, and the leases and
 * checkpoints both share (one process at a time runs each processor, from its checkpoint), with the
 * `svc projections` commands.
 */
export { WorkflowProcessor, checkpointOf, type ServiceWorkflows, type WorkflowProcessorOptions } from './workflow-processor.ts';
export { sqlTimers, type TimerRow, type TimerStore } from './timers.ts';
export { ProjectionRunner, CheckpointMoved, type ProjectionRunnerOptions, type ProjectionStatus, type RebuildProgress, type RebuildReport } from './projection-runner.ts';
export { internalSchemaOf, type Projection } from './projection.ts';
export { ProcessorLeases, defaultLeaseMs, type LeaseSettings } from './leases.ts';
export { caughtUpWith, logTarget } from './caught-up.ts';
export { sqlLeases, LeaseLost, type LeaseStore, type LeaseRow, type Fence } from './lease-store.ts';
export {
  resolveSources,
  sqlCheckpoints,
  type Checkpoint,
  type CheckpointStore,
  type ProcessorSources,
  type ResolvedSources,
} from './checkpoints.ts';
export { runProjectionsCommand, projectionsUsage, isProjectionsCommand, type ProjectionsCommandIo } from './cli.ts';
