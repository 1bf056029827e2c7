/**
 * Workflows in Emmett's shape: a reaction to events of some streams that sends commands to others.
 *
 * `decide(input, state)` and `evolve(state, message)` are pure; the input is a stored event (with the
 * stream it came from and its id), the output is commands, each with an id derived from its input, so
 * a command sent again after a crash appends nothing twice. A workflow instance's state lives on a
 * stream of its own (`workflow-<name>-<instance>`), inbox and outbox at once: each input that
 * mattered is recorded there with the commands it caused, and the state is those messages folded.
 * A processor (src/processors) drives it from a checkpoint: send the commands, then record the
 * messages and move the checkpoint in one transaction; a crash anywhere in between replays the input
 * against the same state and sends the same commands, which their ids make harmless.
 */
import { Type } from 'typebox';
import { defineEvent, eventCatalogue, schemaVersionKey, type DomainEvent, type EventCatalogue, type EventOf } from './events.ts';
import type { Decider, Rejection } from './decider.ts';

/** An input as a workflow sees it: a stored event, checked by its catalogue, and where it was stored. */
export type WorkflowInput<Event extends DomainEvent> = Event extends DomainEvent ? Event & { readonly id: string; readonly streamId: string } : never;

/** A command for another stream; `commandId` is derived from the input (the same input, the same id). */
export interface WorkflowCommand<Command> {
  readonly stream: string;
  readonly command: Command;
  readonly commandId: string;
}

/** What a workflow's state is folded from: the inputs it recorded and the commands they caused. */
export type WorkflowMessage<Input extends DomainEvent, Command> =
  | { readonly kind: 'input'; readonly input: WorkflowInput<Input> }
  | { readonly kind: 'output'; readonly output: WorkflowCommand<Command> };

export interface Workflow<Input extends DomainEvent, State, Command> {
  /** Stable name: its checkpoint, and its instances' streams `workflow-<name>-<instance>`. */
  readonly name: string;
  /** The catalogues of its inputs, and the input types it reacts to (others are never read). */
  readonly inputs: EventCatalogue<any>;
  readonly inputTypes: readonly Input['type'][];
  /** The decider of the streams its commands go to. */
  readonly target: Decider<any, Command, any, Rejection<string>>;
  /** The instance (and so the state) an input belongs to. */
  instanceOf(input: WorkflowInput<Input>): string;
  initialState(): State;
  /** The commands an input causes, given the instance's state (none: nothing to do). */
  decide(input: WorkflowInput<Input>, state: State): readonly WorkflowCommand<Command>[];
  /**
   * The state after a recorded message. Returning the same state object for an input means the input
   * changes nothing: with no command either, it is not recorded at all (most inputs, on a hot log).
   */
  evolve(state: State, message: WorkflowMessage<Input, Command>): State;
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
    },
    { additionalProperties: false },
  ),
);

/** A command the instance sent because of the input recorded before it. */
export const WorkflowCommandSent = defineEvent(
  'WorkflowCommandSent',
  Type.Object({ stream: Type.String(), command_id: Type.String(), command: Type.Unknown() }, { additionalProperties: false }),
);

export const workflowEvents = eventCatalogue('workflow', [WorkflowInputRecorded, WorkflowCommandSent]);
export type WorkflowEvent = EventOf<typeof WorkflowInputRecorded> | EventOf<typeof WorkflowCommandSent>;

/** A recorded workflow event back as the message it records (its input checked by the workflow's catalogue). */
export function messageOf<Input extends DomainEvent, State, Command>(
  workflow: Workflow<Input, State, Command>,
  event: WorkflowEvent,
): WorkflowMessage<Input, Command> {
  if (event.type === 'WorkflowCommandSent') {
    return { kind: 'output', output: { stream: event.data.stream, commandId: event.data.command_id, command: event.data.command as Command } };
  }
  const checked = workflow.inputs.parse({ type: event.data.type, data: event.data.data, metadata: { [schemaVersionKey]: event.data.schema_version } });
  return { kind: 'input', input: { ...checked, id: event.data.event_id, streamId: event.data.stream_id } as WorkflowInput<Input> };
}

/** The messages to record for an input and the commands it caused. */
export function recordsOf<Input extends DomainEvent, State, Command>(
  workflow: Workflow<Input, State, Command>,
  input: WorkflowInput<Input>,
  outputs: readonly WorkflowCommand<Command>[],
): WorkflowEvent[] {
  const { id, streamId, type, data } = input;
  return [
    WorkflowInputRecorded({ event_id: id, stream_id: streamId, type, schema_version: workflow.inputs.versionOf(type), data }),
    ...outputs.map((o) => WorkflowCommandSent({ stream: o.stream, command_id: o.commandId, command: o.command })),
  ];
}

/**
 * One input through a workflow, purely: the commands it causes and the state after it and them, or
 * null when it changes nothing and causes nothing (then it is not recorded).
 */
export function reactTo<Input extends DomainEvent, State, Command>(
  workflow: Workflow<Input, State, Command>,
  state: State,
  input: WorkflowInput<Input>,
): { outputs: readonly WorkflowCommand<Command>[]; state: State } | null {
  const outputs = workflow.decide(input, state);
  let next = workflow.evolve(state, { kind: 'input', input });
  if (outputs.length === 0 && next === state) return null;
  for (const output of outputs) next = workflow.evolve(next, { kind: 'output', output });
  return { outputs, state: next };
}
