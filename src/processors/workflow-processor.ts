/**
 * The workflow processor: drives each workflow from its checkpoint over the global log (catch-up,
 * then live), reading only its input types. It takes the two ports apart (the event log it reads and
 * records instances on, the SQL database its checkpoints live in) with a checkpoint store that is
 * also its lock; positions are the log's, opaque here.
 *
 * A batch: each input that matters is decided against its instance's state (read from the instance's
 * stream, then kept in memory); the commands go out through the command handler under their derived
 * ids; then the inputs and commands are recorded on the instances' streams (under their expected
 * versions) and the checkpoint moves.
 *
 * When the log and the database are one SQL store, one transaction records and moves the checkpoint.
 * A crash before that commit leaves the checkpoint and the states where they were: the batch is
 * decided again, the same commands are sent again with the same ids, and the streams they went to
 * append nothing twice. Of several processes driving the same workflow, the one holding its lease
 * does (the projection runner's leases): the others neither read the log for it nor send anything. A
 * holder that lost its lease (paused past it, taken over) records nothing: the lease is checked in
 * the transaction that records and moves the checkpoint. A holder whose inputs are rare moves its
 * checkpoint past the events it passes over about once a second, so another process's `caughtUp`
 * (and a takeover) need not wait for the next input.
 *
 * A log apart from the database (KurrentDB, a Kafka topic) cannot share a transaction with the
 * checkpoint: the records (their ids derived from the input) are appended first, then the checkpoint
 * moves. A crash between the two leaves inputs recorded past the checkpoint: an instance read from its
 * stream knows which inputs it has recorded, and passes over them when the batch comes again (their
 * commands were sent before they were recorded).
 *
 * Timers: an input a workflow scheduled for itself is recorded on its instance's stream and indexed
 * (timers.ts) in the same transaction; the lease holder gives each once when due (its clock, `now`),
 * recording the input, its commands and its own schedules on the instance's stream and marking it
 * fired in one transaction. A crash before that commit fires it again (same commands, same ids); one
 * due while no process held the lease fires when one takes it. A periodic workflow is seeded when it
 * has no timer pending.
 */
import type { CommandHandler } from '../command-handler/index.ts';
import type { EventLog, RecordedEvent, SqlDatabase, SqlTransaction, StoreTransaction } from '../store/index.ts';
import { isScheduled, reactTo, workflowStream, type DomainEvent, type Workflow, type WorkflowCommand, type WorkflowInput } from '../event-sourcing/index.ts';
import { sqlTimers, type TimerStore } from './timers.ts';
import { addReaction, readInstance, type AnyWorkflow, type Instance, type Output, type Records, type Running } from './workflow-instances.ts';
import { fireDue, hasTimers, type TimerContext } from './workflow-timers.ts';
import {
  caughtUpWith,
  CheckpointMoved,
  LeaseLost,
  logTarget,
  ProcessorLeases,
  resolveSources,
  type CheckpointStore,
  type LeaseSettings,
  type ProcessorSources,
  type ResolvedSources,
} from '../processors/index.ts';


export type WorkflowProcessorOptions = ProcessorSources & WorkflowProcessorSettings;

/** Workflows a service builds (their views are its read models) and how their commands go out (its own steps). */
export interface ServiceWorkflows {
  readonly workflows: readonly Workflow<any, any, any, any>[];
  readonly deliver: Readonly<Record<string, (output: WorkflowCommand<any>) => Promise<void>>>;
}

export interface WorkflowProcessorSettings extends LeaseSettings {
  handler: CommandHandler;
  workflows: readonly Workflow<any, any, any, any>[];
  /** A workflow's commands sent another way than through the handler (by workflow name): a service's own step that sends the command and does what follows it. */
  deliver?: Readonly<Record<string, (output: WorkflowCommand<any>) => Promise<void>>>;
  /** The clock timers are due by (default: the system's). */
  now?: () => Date;
  /** Events read per batch (default 500). */
  batchSize?: number;
  /** Polling fallback when no commit hint arrives (ms). */
  pollIntervalMs?: number;
  /**
   * After a read that caught up, wait this long before reading again (default 100 ms): under steady
   * load the log is read ten times a second, not once per commit, for reactions that can wait that long.
   */
  gatherMs?: number;
  /** How often a holder moves its checkpoint past events it passed over since its last input (default 1,000 ms). */
  idleCheckpointMs?: number;
  /** Told about a failed batch (it is tried again) and about a command its target refused. */
  onError?(workflow: string, error: unknown): void;
}

/** Instances' states kept in memory per workflow (one per key for the carried-holds workflow). */
const cachedInstances = 10_000;

/** The checkpoint name of a workflow (beside the projections' in the same table). */
export const checkpointOf = (workflow: { name: string }): string => `workflow:${workflow.name}`;


export class WorkflowProcessor {
  readonly #sources: ResolvedSources;
  readonly #log: EventLog;
  readonly #db: SqlDatabase;
  readonly #checkpoints: CheckpointStore;
  readonly #handler: CommandHandler;
  readonly #timers: TimerStore;
  readonly #now: () => Date;
  readonly #options: WorkflowProcessorOptions;
  readonly #running = new Map<string, Running>();
  #started = false;
  /** Which workflows this processor drives: those whose lease it holds. */
  readonly #leases: ProcessorLeases;
  #following: Promise<void> | null = null;
  /** What the timers' steps use of this processor (workflow-timers.ts). */
  readonly #timerContext: TimerContext;
  #idleTimer: NodeJS.Timeout | null = null;

  constructor(options: WorkflowProcessorOptions) {
    this.#sources = resolveSources(options);
    this.#log = this.#sources.log;
    this.#db = this.#sources.db;
    this.#checkpoints = this.#sources.checkpoints;
    this.#handler = options.handler;
    this.#timers = sqlTimers(this.#db);
    this.#now = options.now ?? (() => new Date());
    this.#options = options;
    this.#timerContext = {
      db: this.#db,
      timers: this.#timers,
      now: this.#now,
      idleMs: options.idleCheckpointMs ?? 1000,
      expectHeld: (running) => this.#leases.expectHeld([running.checkpoint]),
      holds: (running) => this.#leases.holds(running.checkpoint),
      instance: (running, id) => this.#instance(running, id),
      send: (running, outputs) => this.#send(running, outputs),
      commit: (running, records, alsoInTx) => this.#commit(running, records, alsoInTx),
      fireSoon: (running) => this.#fireSoon(running),
    };
    const names = new Set(options.workflows.map((w) => w.name));
    if (names.size !== options.workflows.length) throw new Error('workflow names must be unique');
    this.#leases = new ProcessorLeases({
      db: this.#db,
      store: this.#sources.leases,
      names: options.workflows.map(checkpointOf),
      settings: options,
      onChange: () => void this.#followHeld(),
      onError: (error) => this.#options.onError?.('leases', error),
    });
  }

  /** This processor's name in the lease table. */
  get leaseHolder(): string {
    return this.#leases.holder;
  }

  /** Creates missing checkpoints, claims the workflows' leases, then drives each it holds from its checkpoint (catch-up first). */
  async start(): Promise<void> {
    if (this.#started) return;
    this.#started = true;
    for (const workflow of this.#options.workflows as readonly AnyWorkflow[]) {
      const running: Running = {
        workflow,
        checkpoint: checkpointOf(workflow),
        position: this.#log.start,
        instances: new Map(),
        subscription: null,
        active: false,
        seeded: false,
        wake: null,
        serial: Promise.resolve(),
      };
      this.#running.set(workflow.name, running);
      await this.#checkpoints.ensure(this.#db, running.checkpoint);
    }
    if (this.#options.workflows.some(hasTimers)) await this.#timers.ensure(this.#db);
    await this.#leases.start();
    await this.#followHeld();
    this.#idleTimer = setInterval(() => {
      for (const running of this.#running.values()) {
        void this.#serially(running, () => this.#moveIdleCheckpoint(running)).catch((error) => this.#failed(running, error));
        if (hasTimers(running.workflow)) this.#fireSoon(running);
      }
      // A reader that failed to start (the database away) is started again.
      if ([...this.#running.values()].some((r) => !r.active && this.#leases.holds(r.checkpoint))) void this.#followHeld();
    }, this.#options.idleCheckpointMs ?? 1000);
    this.#idleTimer.unref();
  }

  /**
   * Resolves once every workflow has reacted to every event committed before the call, whichever
   * process drives it (one driven elsewhere: once its checkpoint passes the log's head as read now).
   */
  async caughtUp(): Promise<void> {
    if (!this.#started) return;
    const checkpointNames = new Map([...this.#running.values()].map((r) => [r.checkpoint, r.workflow.name]));
    await caughtUpWith({
      names: [...this.#running.values()].filter((r) => r.workflow.inputTypes.length > 0).map((r) => r.workflow.name),
      log: this.#log,
      target: () => logTarget(this.#log),
      reader: (name) => this.#running.get(name)?.subscription ?? null,
      stored: async (names) => {
        const stored = await this.#checkpoints.read(this.#db, names.map((name) => this.#running.get(name)!.checkpoint));
        return new Map([...stored].map(([checkpoint, value]) => [checkpointNames.get(checkpoint)!, value]));
      },
      settled: () => this.#following,
      running: () => this.#started,
    });
  }

  /** Stops driving, then lets the leases go: another process takes the workflows over at its next claim. */
  async stop(): Promise<void> {
    this.#started = false;
    if (this.#idleTimer) clearInterval(this.#idleTimer);
    await this.#followHeld();
    await this.#leases.stop();
  }

  /** Follows each workflow whose lease it holds (while started), and stops following the others; one call at a time. */
  #followHeld(): Promise<void> {
    const previous = this.#following;
    const following = (async () => {
      await previous;
      for (const running of this.#running.values()) {
        const wanted = this.#started && this.#leases.holds(running.checkpoint);
        if (wanted && !running.active) await this.#follow(running).catch((e) => this.#options.onError?.(running.workflow.name, e));
        if (!wanted && running.active) await this.#unfollow(running);
      }
    })().finally(() => {
      if (this.#following === following) this.#following = null;
    });
    this.#following = following;
    return following;
  }

  async #unfollow(running: Running): Promise<void> {
    const subscription = running.subscription;
    running.subscription = null;
    running.active = false;
    running.seeded = false;
    if (running.wake) clearTimeout(running.wake);
    running.wake = null;
    await subscription?.stop();
    await running.serial.catch(() => {});
    running.instances.clear();
  }

  /** Runs `step` after the workflow's previous batch or checkpoint move. */
  #serially<T>(running: Running, step: () => Promise<T>): Promise<T> {
    const result = running.serial.catch(() => {}).then(step);
    running.serial = result;
    return result;
  }

  /** A failed batch or checkpoint move: a moved checkpoint restarts the reader from it, a lost lease stops it. */
  #failed(running: Running, error: unknown): void {
    running.instances.clear(); // what was decided in memory may not have been recorded
    if (error instanceof CheckpointMoved) {
      void this.#unfollow(running)
        .then(() => this.#followHeld())
        .catch((e) => this.#options.onError?.(running.workflow.name, e));
      return;
    }
    if (error instanceof LeaseLost) {
      this.#leases.lost(error.names); // stops following it
      return;
    }
    this.#options.onError?.(running.workflow.name, error);
  }

  /**
   * Moves the checkpoint past what the reader passed over since the last input (events of other
   * types), so a process waiting on the checkpoint sees the workflow caught up and a takeover starts
   * near the head; nothing when nothing was passed over.
   */
  async #moveIdleCheckpoint(running: Running): Promise<void> {
    const subscription = running.subscription;
    const log = this.#log;
    if (!subscription || !this.#leases.holds(running.checkpoint)) return;
    const position = subscription.position;
    if (log.comparePositions(position, running.position) <= 0) return;
    const from = running.position;
    await this.#db.transaction(async (tx) => {
      await this.#leases.fence(tx, [running.checkpoint]);
      const locked = await this.#checkpoints.lock(tx, [running.checkpoint]);
      if (log.comparePositions(locked.get(running.checkpoint)?.position ?? log.start, from) !== 0) throw new CheckpointMoved(`checkpoint of ${running.checkpoint} moved`);
      await this.#checkpoints.move(tx, [running.checkpoint], position);
    });
    if (running.subscription === subscription) running.position = position;
  }

  /** (Re)starts reading from the stored checkpoint, with the instances' states read afresh. */
  async #follow(running: Running): Promise<void> {
    const checkpoint = (await this.#checkpoints.read(this.#db, [running.checkpoint])).get(running.checkpoint);
    running.position = checkpoint?.position ?? this.#log.start;
    running.instances.clear();
    running.active = true;
    if (hasTimers(running.workflow)) this.#fireSoon(running);
    if (running.workflow.inputTypes.length === 0) return; // only its own timers
    running.subscription = this.#log.subscribe({
      after: running.position,
      batchSize: this.#options.batchSize ?? 500,
      pollIntervalMs: this.#options.pollIntervalMs,
      eventTypes: running.workflow.inputTypes,
      gatherMs: this.#options.gatherMs ?? 100,
      handle: (events) => this.#serially(running, () => this.#react(running, events)),
      onError: (error) => this.#failed(running, error),
    });
  }

  async #react(running: Running, batch: readonly RecordedEvent[]): Promise<void> {
    const { workflow } = running;
    const log = this.#log;
    this.#leases.expectHeld([running.checkpoint]); // sends nothing once its lease may be another's
    const stored = (await this.#checkpoints.read(this.#db, [running.checkpoint])).get(running.checkpoint);
    if (!stored || log.comparePositions(stored.position, running.position) !== 0) throw new CheckpointMoved(`checkpoint of ${running.checkpoint} moved`);
    const last = batch[batch.length - 1].globalPosition;

    // Decide in memory, instance by instance, in log order.
    const records: Records = { events: new Map(), timers: [] };
    const outputs: Output[] = [];
    for (const event of batch) {
      if (log.comparePositions(event.globalPosition, running.position) <= 0) continue;
      const input = { ...workflow.inputs.parse(event), id: event.id, streamId: event.streamId } as WorkflowInput<DomainEvent>;
      const instance = await this.#instance(running, workflow.instanceOf(input));
      if (instance.recorded?.has(event.id)) {
        // Recorded before a crash kept the checkpoint from moving: not decided again, its timers indexed (again).
        records.timers.push(...(instance.scheduledBy?.get(event.id) ?? []));
        continue;
      }
      const pending = records.events.get(instance);
      const state = pending ? pending.state : instance.state;
      const reaction = reactTo(workflow, state, input, workflow.read ? await workflow.read(input, state) : undefined);
      if (!reaction) continue;
      addReaction(running.workflow, records, instance, input, reaction);
      outputs.push(...reaction.outputs);
    }

    await this.#send(running, outputs);
    await this.#commit(running, records, async (tx) => {
      const locked = await this.#checkpoints.lock(tx, [running.checkpoint]);
      if (log.comparePositions(locked.get(running.checkpoint)?.position ?? log.start, running.position) !== 0) throw new CheckpointMoved(`checkpoint of ${running.checkpoint} moved`);
      await this.#checkpoints.move(tx, [running.checkpoint], last);
    });
    running.position = last;
    if (records.timers.length > 0) this.#fireSoon(running);
  }

  /** Sends the commands; each one's id makes a second sending of it (after a crash, by another process) append nothing. */
  async #send(running: Running, outputs: readonly Output[]): Promise<void> {
    const { workflow } = running;
    const deliver = this.#options.deliver?.[workflow.name];
    for (const output of outputs) {
      if (isScheduled(output)) continue;
      this.#leases.expectHeld([running.checkpoint]);
      if (deliver) {
        await deliver(output);
        continue;
      }
      const { stream, command, commandId } = output;
      const outcome = await this.#handler.handle(stream, command, workflow.target, { commandId, metadata: { workflow: workflow.name } });
      if (!outcome.accepted) this.#options.onError?.(workflow.name, new Error(`${stream} refused ${(command as { type?: string }).type}: ${outcome.rejection.message}`));
    }
  }

  /**
   * Records on the instances' streams (under their expected versions), indexes the timers and runs
   * `alsoInTx`, fenced by the lease: in one transaction when the log and the database are one store;
   * else the records first (a retry appends the same ids at the same versions: nothing twice).
   */
  async #commit(running: Running, records: Records, alsoInTx: (tx: SqlTransaction) => Promise<void>): Promise<void> {
    const expected = (instance: Instance) => (instance.version === 0 ? ('no_stream' as const) : instance.version);
    const sameStore = this.#sources.store !== null;
    if (!sameStore) for (const [instance, { events }] of records.events) await this.#log.append(instance.stream, events, expected(instance));
    await this.#db.transaction(async (tx) => {
      // The appends first: they must be a transaction's first writes.
      if (sameStore) for (const [instance, { events }] of records.events) await (tx as StoreTransaction).append(instance.stream, events, expected(instance));
      await this.#leases.fence(tx, [running.checkpoint]);
      await this.#timers.schedule(tx, running.workflow.name, records.timers);
      await alsoInTx(tx);
    });
    for (const [instance, { state, events }] of records.events) {
      instance.state = state;
      instance.version += events.length;
    }
  }

  /** Fires the workflow's due timers after its work under way (errors handled like a failed batch). */
  #fireSoon(running: Running): void {
    void this.#serially(running, () => fireDue(this.#timerContext, running)).catch((error) => this.#failed(running, error));
  }

  /** An instance's state as its stream holds it (read once, then kept). */
  async #instance(running: Running, id: string): Promise<Instance> {
    const stream = workflowStream(running.workflow.name, id);
    let instance = running.instances.get(stream);
    if (instance) {
      running.instances.delete(stream); // most recently used last: the first ones are evicted
      running.instances.set(stream, instance);
    } else {
      instance = await readInstance(this.#log, running.workflow, stream, this.#sources.store === null);
      running.instances.set(stream, instance);
      // Bounded: an evicted instance is read from its stream again when an input for it comes.
      if (running.instances.size > cachedInstances) running.instances.delete(running.instances.keys().next().value!);
    }
    return instance;
  }
}
