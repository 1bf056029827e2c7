/**
 * A Kafka consumer's partitions: the messages each holds, its ledger (loaded from the group's commit,
 * absorbed again after a crash) and its commits, one at a time, counted only once the broker took them.
 */
import type { Admin, Consumer } from 'kafkajs';
import { DispatchLeaseLost } from './types.ts';
import { PartitionLedger } from './kafka-ledger.ts';

/** A message fetched and not acknowledged, held by its partition in the consumer. */
export interface Held {
  readonly offset: bigint;
  readonly key: string;
  readonly value: Buffer | null;
  /** Publish time (the record's timestamp), then the publisher's sequence: the order handlers start in. */
  readonly order: readonly [number, number];
  /** `arriving`: fetched in a response not yet wholly handed over; `ready`: to deliver. */
  state: 'arriving' | 'ready' | 'starting' | 'running' | 'backoff';
  controller: AbortController;
  settled?: Promise<void>;
  timer?: NodeJS.Timeout;
}

export interface PartitionState {
  readonly partition: number;
  ledger: PartitionLedger | null;
  loading: Promise<PartitionLedger> | null;
  readonly held: Map<bigint, Held>;
  committer: Committer;
  paused: boolean;
  lost: boolean;
  /** Kept through a crash and given back: the group's commit (another member may have had the partition meanwhile) is being absorbed; nothing begins or is committed until then. */
  resync: Promise<void> | null;
}

/** One commit at a time per partition; `flush` resolves once a commit sent after it was called has ended. */
export class Committer {
  #requested = 0;
  #done = 0;
  #running = false;
  #waiters: Array<{ version: number; resolve: () => void }> = [];
  #retry: NodeJS.Timeout | undefined;
  /** The last commit failed: what is in memory is not in Kafka yet. */
  #unsaved = false;
  readonly #commit: () => Promise<void>;
  readonly #reportError: (error: unknown) => void;

  constructor(commit: () => Promise<void>, reportError: (error: unknown) => void) {
    this.#commit = commit;
    this.#reportError = reportError;
  }

  flush(): Promise<void> {
    const version = ++this.#requested;
    const done = new Promise<void>((resolve) => this.#waiters.push({ version, resolve }));
    void this.#run();
    return done;
  }

  /** Changes not yet in Kafka (being committed, or their commit failed). */
  get dirty(): boolean {
    return this.#running || this.#done < this.#requested || this.#unsaved;
  }

  /** Resolves once what is in memory was committed (or its last try failed, reported). */
  async idle(): Promise<void> {
    clearTimeout(this.#retry);
    if (this.dirty) await this.flush();
  }

  cancel(): void {
    clearTimeout(this.#retry);
  }

  async #run(): Promise<void> {
    if (this.#running) return;
    this.#running = true;
    try {
      while (this.#done < this.#requested) {
        const version = this.#requested;
        try {
          await this.#commit();
          this.#unsaved = false;
        } catch (error) {
          this.#unsaved = true;
          this.#reportError(error);
          // the state is still in memory: committed again shortly (an acknowledgement not yet committed is only redelivered if this consumer dies)
          clearTimeout(this.#retry);
          this.#retry = setTimeout(() => void this.flush(), 1_000);
          this.#retry.unref();
        }
        this.#done = version;
        const waiting = this.#waiters.filter((w) => w.version <= version);
        this.#waiters = this.#waiters.filter((w) => w.version > version);
        for (const w of waiting) w.resolve();
      }
    } finally {
      this.#running = false;
    }
  }
}

/** What the partitions of one consumer need from it. */
export interface PartitionsContext {
  readonly topic: string;
  readonly groupId: string;
  readonly admin: Admin;
  readonly consumer: Consumer;
  /** Resolves once the transport's admin client is connected. */
  ready(): Promise<void>;
  reportError(error: unknown): void;
  /** Begins what may begin now (a resync ended). */
  schedule(): void;
}

/** The partitions one consumer is assigned (or holds messages of), by number. */
export class ConsumerPartitions {
  readonly states = new Map<number, PartitionState>();
  readonly #c: PartitionsContext;
  /**
   * The commits the broker took (kafkajs tells each one): kafkajs's `commitOffsets` resolves without
   * sending anything while its runner is not running (from a crash until its new group has joined, and
   * while a crash is being handled), so a commit counts as made only once it is seen here.
   */
  readonly #landed = new Set<string>();

  constructor(context: PartitionsContext) {
    this.#c = context;
    const { consumer, topic } = context;
    consumer.on(consumer.events.COMMIT_OFFSETS, ({ payload }) => {
      for (const t of payload.topics) if (t.topic === topic) for (const p of t.partitions) this.#landed.add(`${p.partition}@${p.offset}`);
    });
  }

  #commitOf(state: PartitionState): () => Promise<void> {
    const { consumer, topic } = this.#c;
    return async () => {
      if (state.resync) await state.resync;
      const ledger = state.ledger;
      // a partition taken from this consumer is never written to again: the new owner's commits are the truth
      if (state.lost || !ledger || ledger.base === null) return;
      const mark = `${state.partition}@${ledger.base}`;
      this.#landed.delete(mark);
      await consumer.commitOffsets([{ topic, partition: state.partition, offset: ledger.base.toString(), metadata: ledger.encode() }]);
      if (!this.#landed.delete(mark)) throw new Error(`dispatch commit of ${topic}/${state.partition} not sent: the Kafka client is joining its group; tried again`);
    };
  }

  stateOf(partition: number): PartitionState {
    let state = this.states.get(partition);
    if (!state) {
      const made = { partition, ledger: null, loading: null, held: new Map(), paused: false, lost: false, resync: null } as unknown as PartitionState;
      made.committer = new Committer(this.#commitOf(made), this.#c.reportError);
      this.states.set(partition, (state = made));
    }
    return state;
  }

  /** The group's commits of the topic, in one request. */
  #fetchCommitted() {
    const { admin, groupId, topic } = this.#c;
    return this.#c.ready().then(() => admin.fetchOffsets({ groupId, topics: [topic] }));
  }

  /** The partitions' ledgers, from the group's commits, in one request. */
  load(fresh: PartitionState[]): void {
    const pending = fresh.filter((s) => !s.ledger && !s.loading);
    if (pending.length === 0) return;
    const fetched = this.#fetchCommitted();
    for (const state of pending) {
      state.loading = fetched.then(([offsets]) => {
        const committed = offsets?.partitions.find((p) => p.partition === state.partition);
        state.ledger ??= PartitionLedger.restore(committed?.offset, committed?.metadata);
        return state.ledger;
      });
      state.loading.catch(() => (state.loading = null)); // the next batch tries again
    }
  }

  /**
   * Partitions kept through a crash and given back: another member may have had them meanwhile and
   * acknowledged messages, committed past what this one knows. Its commit is absorbed before anything
   * here begins or commits, so a commit from here never takes an acknowledgement back.
   */
  resync(kept: PartitionState[]): void {
    if (kept.length === 0) return;
    const fetched = this.#fetchCommitted();
    for (const state of kept) {
      const done: Promise<void> = fetched
        .then(([offsets]) => {
          const committed = offsets?.partitions.find((p) => p.partition === state.partition);
          state.ledger?.absorb(committed?.offset, committed?.metadata);
        })
        .catch((error: unknown) => this.#c.reportError(error)) // what this member knows is committed as it is: at worst, messages come again
        .finally(() => {
          if (state.resync === done) state.resync = null;
          this.#c.schedule();
        });
      state.resync = done;
    }
  }

  /** The partition is another member's now: its handlers are told, its messages forgotten (never acknowledged from here). */
  lose(state: PartitionState): void {
    state.lost = true;
    state.committer.cancel();
    this.states.delete(state.partition);
    for (const held of state.held.values()) {
      clearTimeout(held.timer);
      if (held.state === 'starting' || held.state === 'running') held.controller.abort(new DispatchLeaseLost(`${this.#c.topic}/${state.partition}/${held.offset}`));
    }
    state.held.clear();
  }

  loseAll(): void {
    for (const state of [...this.states.values()]) this.lose(state);
  }
}
