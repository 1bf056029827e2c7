/**
 * What `events/`, `commands/` and `projections/` build on: typed events, deciders, rejections and
 * projections. They import this module and nothing else of `src/`; the arrows run one way.
 */
export { defineEvent, eventCatalogue, EventSchemaViolation, schemaVersionKey, type DomainEvent, type EventCatalogue, type EventOf, type EventType, type Upcaster } from './events.ts';
export { reject, isRejection, decisionEvents, foldEvents, type Decider, type Decision, type Rejection } from './decider.ts';
export { defineBatchProjection, defineProjection, type Recorded } from './projection.ts';
export {
  messageOf,
  reactTo,
  recordsOf,
  workflowEvents,
  workflowStream,
  type Workflow,
  type WorkflowCommand,
  type WorkflowEvent,
  type WorkflowInput,
  type WorkflowMessage,
} from './workflow.ts';
export type { Projection } from '../projection-runner/index.ts';
export type { Queryable } from '../store/index.ts';
/** For projections that copy client strings into `text` columns (which cannot hold U+0000 or a lone surrogate). */
export { toStorableText } from '../store/index.ts';
export { Type, type Static, type TSchema } from 'typebox';
