/** Projections follow the log: the runner, the projection shape, and the `svc projections` commands. */
export { ProjectionRunner, CheckpointMoved, type ProjectionRunnerOptions, type ProjectionStatus, type RebuildProgress, type RebuildReport } from './runner.ts';
export type { Projection } from './projection.ts';
export { ensureCheckpoint, moveCheckpoints, readCheckpoint, readCheckpoints, type Checkpoint } from './checkpoints.ts';
export { runProjectionsCommand, projectionsUsage, isProjectionsCommand, type ProjectionsCommandIo } from './cli.ts';
