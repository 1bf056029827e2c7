/** Projections follow the log: the runner, the projection shape, the checkpoint store (shared with workflows), and the `svc projections` commands. */
export { ProjectionRunner, CheckpointMoved, type ProjectionRunnerOptions, type ProjectionStatus, type RebuildProgress, type RebuildReport } from './runner.ts';
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
