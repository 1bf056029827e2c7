/** Projections follow the log: the runner, the projection shape, and the `svc projections` commands. */
export { ProjectionRunner, CheckpointMoved, type ProjectionRunnerOptions, type ProjectionStatus, type RebuildProgress, type RebuildReport } from './runner.ts';
export { defineProjection, type Projection, type EventHandler } from './projection.ts';
export { runProjectionsCommand, type ProjectionsCommandIo } from './cli.ts';
