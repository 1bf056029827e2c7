/**
 * A workflow as the workflow processor drives it, and its instances: each one's state folded from its
 * stream, its version, and (with the log apart from the database) what it recorded; and what one step
 * of the processor records on instances' streams and in the timer index.
 */
import type { EventLog, GlobalPosition, NewEvent, Subscription } from '../store/index.ts';
import { eventIdFor } from '../command-handler/index.ts';
import {
  isScheduled,
  messageOf,
  recordsOf,
  schemaVersionKey,
  workflowEvents,
  type DomainEvent,
  type Workflow,
  type WorkflowInput,
  type WorkflowOutput,
  type WorkflowSchedule,
} from '../event-sourcing/index.ts';
import type { TimerRow } from './timers.ts';

export type AnyWorkflow = Workflow<DomainEvent, unknown, unknown, unknown>;
export type Output = WorkflowOutput<DomainEvent, unknown>;

export interface Instance {
  readonly stream: string;
  state: unknown;
  version: number;
  /** With the log apart from the database: ids of the inputs this stream has recorded (those past the checkpoint are not decided again). */
  readonly recorded: Set<string> | null;
  /** With the log apart: the timers each recorded input scheduled (indexed again when a crash came between the record and the index). */
  readonly scheduledBy: Map<string, TimerRow[]> | null;
}

/** A workflow as one processor drives it. */
export interface Running {
  readonly workflow: AnyWorkflow;
  readonly checkpoint: string;
  /** Where this runner's reading stands (what the stored checkpoint must still say at its next commit). */
  position: GlobalPosition;
  /** Instances' states as stored, by stream. */
  readonly instances: Map<string, Instance>;
  subscription: Subscription | null;
  /** Driven here (its lease held): read from the log when it has log inputs, its timers fired. */
  active: boolean;
  /** Seeded since it was last taken up (a periodic workflow with no timer pending). */
  seeded: boolean;
  /** The wake-up for its next timer, when due before the next idle round. */
  wake: NodeJS.Timeout | null;
  /** Its batches, timers and idle checkpoint moves, one at a time. */
  serial: Promise<unknown>;
}

/** What one step records on instances' streams (their events and the state after them, by instance) and indexes (timers). */
export interface Records {
  readonly events: Map<Instance, { state: unknown; events: NewEvent[] }>;
  readonly timers: TimerRow[];
}

/** An instance read from its stream; `apart`: the log is apart from the database (what it recorded is kept). */
export async function readInstance(log: EventLog, workflow: AnyWorkflow, stream: string, apart: boolean): Promise<Instance> {
  const read = await log.readStream(stream);
  const events = read.events.map((e) => workflowEvents.parse(e));
  const state = events.reduce((folded, event) => workflow.evolve(folded, messageOf(workflow, event)), workflow.initialState());
  const recorded = apart ? new Set(read.events.map((e) => e.metadata.input_event_id as string)) : null;
  const scheduledBy = apart ? new Map<string, TimerRow[]>() : null;
  events.forEach((event, i) => {
    if (!scheduledBy || event.type !== 'WorkflowInputScheduled') return;
    const by = read.events[i].metadata.input_event_id as string;
    const { timer_id: timerId, at, type, schema_version: schemaVersion, data } = event.data;
    scheduledBy.set(by, [...(scheduledBy.get(by) ?? []), { timerId, stream, at: new Date(at), input: { type, schemaVersion, data } }]);
  });
  return { stream, state, version: read.version, recorded, scheduledBy };
}

/** A schedule as the timer index keeps it. */
export function timerRow(workflow: AnyWorkflow, stream: string, { schedule }: WorkflowSchedule<DomainEvent>): TimerRow {
  return { timerId: schedule.timerId, stream, at: new Date(schedule.at), input: { type: schedule.input.type, schemaVersion: workflow.inputs.versionOf(schedule.input.type), data: schedule.input.data } };
}

/** Adds an input's records (under ids derived from it) and its schedules' index rows to what the step records. */
export function addReaction(workflow: AnyWorkflow, records: Records, instance: Instance, input: WorkflowInput<DomainEvent>, reaction: { outputs: readonly Output[]; state: unknown }): void {
  const events = recordsOf(workflow, input, reaction.outputs).map(
    (e, i): NewEvent => ({ id: eventIdFor(`${workflow.name}:${input.id}`, i), type: e.type, data: e.data, metadata: { [schemaVersionKey]: 1, input_event_id: input.id } }),
  );
  const pending = records.events.get(instance);
  records.events.set(instance, { state: reaction.state, events: [...(pending?.events ?? []), ...events] });
  records.timers.push(...reaction.outputs.filter(isScheduled).map((o) => timerRow(workflow, instance.stream, o)));
}
