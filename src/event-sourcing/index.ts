/**
 * What `events/`, `deciders/` and `projections/` build on, and the pattern each domain follows (the
 * meter is the worked example: events/meter.ts, deciders/meter.ts, workflows/carried-holds.ts,
 * projections/usage-ledger.ts):
 * - events: versioned TypeBox schemas in a catalogue that checks and upcasts every stored event;
 * - deciders: every rule of one stream, pure, rejections as values (deciders/<category>.ts);
 * - workflows: reactions across streams, pure decide/evolve over inputs, commands out with derived
 *   ids, state on a stream of their own (workflow.ts; driven by src/processors);
 * - projections: SQL tables and idempotent handlers (driven by src/processors).
 * Processors take the store's two ports (src/store/types.ts: the event log they read, the SQL database
 * where their rows and checkpoints live). Domain folders import this module and nothing else of
 * `src/`; the arrows run one way.
 */
export { defineEvent, eventCatalogue, EventSchemaViolation, schemaVersionKey, type DomainEvent, type EventCatalogue, type EventOf, type EventType, type Upcaster } from './events.ts';
export { reject, isRejection, decisionEvents, foldEvents, type Decider, type Decision, type Rejection } from './decider.ts';
export { defineBatchProjection, defineProjection, type Recorded } from './projection.ts';
export {
  isScheduled,
  messageOf,
  outputRecord,
  reactTo,
  recordsOf,
  scheduleInput,
  workflowEvents,
  workflowStream,
  type Workflow,
  type WorkflowCommand,
  type WorkflowEvent,
  type WorkflowInput,
  type WorkflowMessage,
  type WorkflowOutput,
  type WorkflowSchedule,
} from './workflow.ts';
export type { Projection } from '../processors/index.ts';
export type { Queryable } from '../store/index.ts';
/** For projections that copy client strings into `text` columns (which cannot hold U+0000 or a lone surrogate). */
export { toStorableText } from '../store/index.ts';
export { Type, type Static, type TSchema } from 'typebox';
