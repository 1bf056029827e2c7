/**
 * Workflows in Emmett's shape: a reaction to events of some streams, and to the passing of time, that
 * sends commands to others.
 *
 * `decide(input, state)` and `evolve(state, message)` are pure; the input is a stored event (with the
 * stream it came from and its id), the output is commands, each with an id derived from its input, so
 * a command sent again after a crash appends nothing twice. Beside commands, `decide` may schedule an
 * input for itself: "at time T, give me this input" (`scheduleInput`), under a timer id derived from
 * what it is for. A workflow instance's state lives on a stream of its own
 * (`workflow-<name>-<instance>`), inbox and outbox at once: each input that mattered is recorded there
 * with the commands it caused and the inputs it scheduled, and the state is those messages folded.
 * A processor (src/processors) drives it from a checkpoint: send the commands, then record the
 * messages and move the checkpoint in one transaction; a crash anywhere in between replays the input
 * against the same state and sends the same commands, which their ids make harmless. It also gives
 * each scheduled input once when due, recording that it fired in the transaction that records what it
 * caused; a periodic workflow is seeded (`seed`) and each tick schedules the next.
 */
import { Type } from 'typebox';
import { defineEvent, eventCatalogue, schemaVersionKey, type DomainEvent, type EventCatalogue, type EventOf } from './events.ts';
import type { Decider, Rejection } from './decider.ts';

/**
 * An input as a workflow sees it: a stored event, checked by its catalogue, and where it was stored;
 * or one of its own scheduled inputs given when due (`id`: its timer's, `streamId`: the instance's
 * stream that scheduled it, `firedAt`: when it was given, at or after its time).
 */
export type WorkflowInput<Event extends DomainEvent> = Event extends DomainEvent
  ? Event & { readonly id: string; readonly streamId: string; readonly firedAt?: string }
  : never;

/** A command for another stream; `commandId` is derived from the input (the same input, the same id). */
export interface WorkflowCommand<Command> {
  readonly stream: string;
  readonly command: Command;
  readonly commandId: string;
}

/**
 * "At `at`, give me `input`": one of the workflow's own scheduled input types, kept on the instance's
 * stream and given to the workflow once when due, under `timerId` (derived from what it is for: the
 * same decision, the same timer).
 */
export interface WorkflowSchedule<Input extends DomainEvent> {
  readonly schedule: { readonly at: string; readonly timerId: string; readonly input: Input };
}

/** What `decide` returns: commands for other streams, and inputs scheduled for itself. */
export type WorkflowOutput<Input extends DomainEvent, Command> = WorkflowCommand<Command> | WorkflowSchedule<Input>;

export const isScheduled = <Input extends DomainEvent, Command>(output: WorkflowOutput<Input, Command>): output is WorkflowSchedule<Input> => 'schedule' in output;

/** A scheduled input: `input` given to the workflow at `at` (an ISO time), once, under `timerId`. */
export const scheduleInput = <Input extends DomainEvent>(at: string, timerId: string, input: Input): WorkflowSchedule<Input> => ({ schedule: { at, timerId, input } });

/** What a workflow's state is folded from: the inputs it recorded and what they caused (commands, schedules). */
export type WorkflowMessage<Input extends DomainEvent, Command> =
  | { readonly kind: 'input'; readonly input: WorkflowInput<Input> }
  | { readonly kind: 'output'; readonly output: WorkflowOutput<Input, Command> };

export interface Workflow<Input extends DomainEvent, State, Command, View = undefined> {
  /** Stable name: its checkpoint, and its instances' streams `workflow-<name>-<instance>`. */
  readonly name: string;
  /** The catalogues of its inputs (those it schedules for itself too), and the input types it reads from the log (others are never read). */
  readonly inputs: EventCatalogue<any>;
  readonly inputTypes: readonly Input['type'][];
  /** The input types it schedules for itself (none: it has no timers). */
  readonly scheduledTypes?: readonly Input['type'][];
  /** The decider of the streams its commands go to. */
  readonly target: Decider<any, Command, any, Rejection<string>>;
  /** The instance (and so the state) an input belongs to. */
  instanceOf(input: WorkflowInput<Input>): string;
  initialState(): State;
  /**
   * What it reads before deciding an input (a read model at that time: the holds past their expiry,
   * the day's spend); not recorded, so only for inputs whose commands' ids make a second decision harmless.
   */
  read?(input: WorkflowInput<Input>, state: State): Promise<View>;
  /** The commands an input causes and the inputs it schedules, given the instance's state (none: nothing to do). */
  decide(input: WorkflowInput<Input>, state: State, view: View): readonly WorkflowOutput<Input, Command>[];
  /**
   * The state after a recorded message. Returning the same state object for an input means the input
   * changes nothing: with no output either, it is not recorded at all (most inputs, on a hot log).
   */
  evolve(state: State, message: WorkflowMessage<Input, Command>): State;
  /**
   * A periodic workflow's first timers, scheduled by the processor when the workflow has none pending
   * (its first start, or a chain that ended): from then on each tick schedules the next.
   */
  seed?(now: string): readonly WorkflowSchedule<Input>[];
}

export const workflowStream = (name: string, instance: string): string => `workflow-${name}-${instance}`;

/** An input a workflow instance reacted to, as it was stored (its data checked and upcast then). */
export const WorkflowInputRecorded = defineEvent(
  'WorkflowInputRecorded',
  Type.Object(
    {
      event_id: Type.String(),
      stream_id: Type.String(),
      type: Type.String(),
      /** The version of the input's type that `data` is at (a later release upcasts it on reading). */
      schema_version: Type.Integer({ minimum: 1 }),
      data: Type.Unknown(),
      /** A scheduled input: when it was given (its timer fired). */
      fired_at: Type.Optional(Type.String()),
    },
    { additionalProperties: false },
  ),
);

/** A command the instance sent because of the input recorded before it. */
export const WorkflowCommandSent = defineEvent(
  'WorkflowCommandSent',
  Type.Object({ stream: Type.String(), command_id: Type.String(), command: Type.Unknown() }, { additionalProperties: false }),
);

/** An input the instance scheduled for itself, at `at`, because of the input recorded before it (or as a periodic workflow's seed). */
export const WorkflowInputScheduled = defineEvent(
  'WorkflowInputScheduled',
  Type.Object(
    { timer_id: Type.String(), at: Type.String(), type: Type.String(), schema_version: Type.Integer({ minimum: 1 }), data: Type.Unknown() },
    { additionalProperties: false },
  ),
);

export const workflowEvents = eventCatalogue('workflow', [WorkflowInputRecorded, WorkflowCommandSent, WorkflowInputScheduled]);
export type WorkflowEvent = EventOf<typeof WorkflowInputRecorded> | EventOf<typeof WorkflowCommandSent> | EventOf<typeof WorkflowInputScheduled>;

/** An input as its workflow's catalogue checks it, from its stored type, version and data. */
const checkedInput = (workflow: Workflow<any, any, any, any>, type: string, schemaVersion: number, data: unknown): DomainEvent =>
  workflow.inputs.parse({ type, data, metadata: { [schemaVersionKey]: schemaVersion } });

/** A recorded workflow event back as the message it records (its input checked by the workflow's catalogue). */
export function messageOf<Input extends DomainEvent, State, Command, View>(
  workflow: Workflow<Input, State, Command, View>,
  event: WorkflowEvent,
): WorkflowMessage<Input, Command> {
  if (event.type === 'WorkflowCommandSent') {
    return { kind: 'output', output: { stream: event.data.stream, commandId: event.data.command_id, command: event.data.command as Command } };
  }
  if (event.type === 'WorkflowInputScheduled') {
    const input = checkedInput(workflow, event.data.type, event.data.schema_version, event.data.data) as Input;
    return { kind: 'output', output: scheduleInput(event.data.at, event.data.timer_id, input) };
  }
  const checked = checkedInput(workflow, event.data.type, event.data.schema_version, event.data.data);
  const firedAt = event.data.fired_at === undefined ? {} : { firedAt: event.data.fired_at };
  return { kind: 'input', input: { ...checked, id: event.data.event_id, streamId: event.data.stream_id, ...firedAt } as WorkflowInput<Input> };
}

/** The record of an output: a command sent, or an input scheduled. */
export function outputRecord<Input extends DomainEvent, Command>(workflow: Workflow<Input, any, Command, any>, output: WorkflowOutput<Input, Command>): WorkflowEvent {
  if (!isScheduled(output)) return WorkflowCommandSent({ stream: output.stream, command_id: output.commandId, command: output.command });
  const { at, timerId, input } = output.schedule;
  return WorkflowInputScheduled({ timer_id: timerId, at, type: input.type, schema_version: workflow.inputs.versionOf(input.type), data: input.data });
}

/** The messages to record for an input and what it caused. */
export function recordsOf<Input extends DomainEvent, State, Command, View>(
  workflow: Workflow<Input, State, Command, View>,
  input: WorkflowInput<Input>,
  outputs: readonly WorkflowOutput<Input, Command>[],
): WorkflowEvent[] {
  const { id, streamId, type, data, firedAt } = input;
  return [
    WorkflowInputRecorded({ event_id: id, stream_id: streamId, type, schema_version: workflow.inputs.versionOf(type), data, ...(firedAt === undefined ? {} : { fired_at: firedAt }) }),
    ...outputs.map((o) => outputRecord(workflow, o)),
  ];
}

/**
 * One input through a workflow, purely: what it causes and the state after it and them, or null when
 * it changes nothing and causes nothing (then it is not recorded). A scheduled input that fired is
 * always recorded: that it fired is what keeps it from firing again.
 */
export function reactTo<Input extends DomainEvent, State, Command, View>(
  workflow: Workflow<Input, State, Command, View>,
  state: State,
  input: WorkflowInput<Input>,
  view?: View,
): { outputs: readonly WorkflowOutput<Input, Command>[]; state: State } | null {
  const outputs = workflow.decide(input, state, view as View);
  let next = workflow.evolve(state, { kind: 'input', input });
  if (outputs.length === 0 && next === state && input.firedAt === undefined) return null;
  for (const output of outputs) next = workflow.evolve(next, { kind: 'output', output });
  return { outputs, state: next };
}
