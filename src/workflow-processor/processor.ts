/**
 * The workflow processor: drives each workflow from its checkpoint over the global log (catch-up,
 * then live), reading only its input types.
 *
 * A batch: each input that matters is decided against its instance's state (read from the instance's
 * stream, then kept in memory); the commands go out through the command handler under their derived
 * ids; then one transaction records the inputs and commands on the instances' streams (under their
 * expected versions) and moves the checkpoint. A crash before that commit leaves the checkpoint and
 * the states where they were: the batch is decided again, the same commands are sent again with the
 * same ids, and the streams they went to append nothing twice. Another process driving the same
 * workflow finds the checkpoint moved and goes on from where it got to.
 */
import type { CommandHandler } from '../command-handler/index.ts';
import { comparePositions, logStart, type EventStore, type GlobalPosition, type NewEvent, type RecordedEvent, type Subscription } from '../store/index.ts';
import { eventIdFor } from '../command-handler/index.ts';
import {
  messageOf,
  reactTo,
  recordsOf,
  schemaVersionKey,
  workflowEvents,
  workflowStream,
  type DomainEvent,
  type Workflow,
  type WorkflowInput,
} from '../event-sourcing/index.ts';
import { CheckpointMoved, ensureCheckpoint, moveCheckpoints, readCheckpoint, readCheckpoints } from '../projection-runner/index.ts';

type AnyWorkflow = Workflow<DomainEvent, unknown, unknown>;

export interface WorkflowProcessorOptions {
  store: EventStore;
  handler: CommandHandler;
  workflows: readonly Workflow<any, any, any>[];
  /** Events read per batch (default 500). */
  batchSize?: number;
  /** Polling fallback when no commit hint arrives (ms). */
  pollIntervalMs?: number;
  /** Told about a failed batch (it is tried again) and about a command its target refused. */
  onError?(workflow: string, error: unknown): void;
}

/** The checkpoint name of a workflow (beside the projections' in the same table). */
export const checkpointOf = (workflow: { name: string }): string => `workflow:${workflow.name}`;

interface Instance {
  readonly stream: string;
  state: unknown;
  version: number;
}

interface Running {
  readonly workflow: AnyWorkflow;
  readonly checkpoint: string;
  /** Where this runner's reading stands (what the stored checkpoint must still say at its next commit). */
  position: GlobalPosition;
  /** Instances' states as stored, by stream. */
  readonly instances: Map<string, Instance>;
  subscription: Subscription | null;
}

export class WorkflowProcessor {
  readonly #store: EventStore;
  readonly #handler: CommandHandler;
  readonly #options: WorkflowProcessorOptions;
  readonly #running = new Map<string, Running>();
  #started = false;

  constructor(options: WorkflowProcessorOptions) {
    this.#store = options.store;
    this.#handler = options.handler;
    this.#options = options;
    const names = new Set(options.workflows.map((w) => w.name));
    if (names.size !== options.workflows.length) throw new Error('workflow names must be unique');
  }

  /** Creates missing checkpoints, then drives every workflow from its own (catch-up first). */
  async start(): Promise<void> {
    if (this.#started) return;
    this.#started = true;
    for (const workflow of this.#options.workflows as readonly AnyWorkflow[]) {
      const running: Running = { workflow, checkpoint: checkpointOf(workflow), position: logStart, instances: new Map(), subscription: null };
      this.#running.set(workflow.name, running);
      await ensureCheckpoint(this.#store, running.checkpoint);
      await this.#follow(running);
    }
  }

  /** Resolves once every workflow has reacted to every event committed before the call. */
  async caughtUp(): Promise<void> {
    for (const running of this.#running.values()) {
      for (;;) {
        const subscription = running.subscription;
        try {
          await subscription?.caughtUp();
          if (subscription === running.subscription) break;
        } catch (error) {
          if (!this.#started) throw error;
        }
      }
    }
  }

  async stop(): Promise<void> {
    this.#started = false;
    for (const running of this.#running.values()) {
      const subscription = running.subscription;
      running.subscription = null;
      await subscription?.stop();
    }
  }

  /** (Re)starts reading from the stored checkpoint, with the instances' states read afresh. */
  async #follow(running: Running): Promise<void> {
    const checkpoint = await readCheckpoint(this.#store, running.checkpoint);
    running.position = checkpoint?.position ?? logStart;
    running.instances.clear();
    running.subscription = this.#store.subscribe({
      after: running.position,
      batchSize: this.#options.batchSize ?? 500,
      pollIntervalMs: this.#options.pollIntervalMs,
      eventTypes: running.workflow.inputTypes,
      handle: (events) => this.#react(running, events),
      onError: (error) => {
        running.instances.clear(); // what was decided in memory may not have been recorded
        if (error instanceof CheckpointMoved) {
          const previous = running.subscription;
          running.subscription = null;
          void previous
            ?.stop()
            .then(() => (this.#started ? this.#follow(running) : undefined))
            .catch((e) => this.#options.onError?.(running.workflow.name, e));
          return;
        }
        this.#options.onError?.(running.workflow.name, error);
      },
    });
  }

  async #react(running: Running, batch: readonly RecordedEvent[]): Promise<void> {
    const { workflow } = running;
    const stored = (await readCheckpoints(this.#store, [running.checkpoint])).get(running.checkpoint);
    if (!stored || comparePositions(stored.position, running.position) !== 0) throw new CheckpointMoved(`checkpoint of ${running.checkpoint} moved`);
    const last = batch[batch.length - 1].globalPosition;

    // Decide in memory, instance by instance, in log order.
    const records = new Map<Instance, { state: unknown; events: NewEvent[] }>();
    const commands: { stream: string; command: unknown; commandId: string }[] = [];
    for (const event of batch) {
      if (comparePositions(event.globalPosition, running.position) <= 0) continue;
      const input = { ...workflow.inputs.parse(event), id: event.id, streamId: event.streamId } as WorkflowInput<DomainEvent>;
      const instance = await this.#instance(running, workflow.instanceOf(input));
      const pending = records.get(instance);
      const reaction = reactTo(workflow, pending ? pending.state : instance.state, input);
      if (!reaction) continue;
      const events = recordsOf(workflow, input, reaction.outputs).map(
        (e, i): NewEvent => ({ id: eventIdFor(`${workflow.name}:${event.id}`, i), type: e.type, data: e.data, metadata: { [schemaVersionKey]: 1, input_event_id: event.id } }),
      );
      records.set(instance, { state: reaction.state, events: [...(pending?.events ?? []), ...events] });
      commands.push(...reaction.outputs);
    }

    // Send; each command's id makes a second sending of it (after a crash, by another process) append nothing.
    for (const { stream, command, commandId } of commands) {
      const outcome = await this.#handler.handle(stream, command, workflow.target, { commandId, metadata: { workflow: workflow.name } });
      if (!outcome.accepted) this.#options.onError?.(workflow.name, new Error(`${stream} refused ${(command as { type?: string }).type}: ${outcome.rejection.message}`));
    }

    // Record and move the checkpoint, together: the appends first (they must be a transaction's first writes).
    await this.#store.transaction(async (tx) => {
      for (const [instance, { events }] of records) await tx.append(instance.stream, events, instance.version === 0 ? 'no_stream' : instance.version);
      const locked = await readCheckpoints(tx, [running.checkpoint], true);
      if (comparePositions(locked.get(running.checkpoint)?.position ?? logStart, running.position) !== 0) throw new CheckpointMoved(`checkpoint of ${running.checkpoint} moved`);
      await moveCheckpoints(tx, [running.checkpoint], last);
    });
    for (const [instance, { state, events }] of records) {
      instance.state = state;
      instance.version += events.length;
    }
    running.position = last;
  }

  /** An instance's state as its stream holds it (read once, then kept). */
  async #instance(running: Running, id: string): Promise<Instance> {
    const stream = workflowStream(running.workflow.name, id);
    let instance = running.instances.get(stream);
    if (!instance) {
      const read = await this.#store.readStream(stream);
      const messages = read.events.map((e) => messageOf(running.workflow, workflowEvents.parse(e)));
      const state = messages.reduce((folded, message) => running.workflow.evolve(folded, message), running.workflow.initialState());
      instance = { stream, state, version: read.version };
      running.instances.set(stream, instance);
    }
    return instance;
  }
}
