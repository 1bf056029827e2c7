/**
 * Group commit: appends from many concurrent callers are coalesced into one batch, sent to the database
 * in one round trip and made durable by one commit. A batch holds each stream at most once and never a
 * stream that an in-flight batch holds, so appends to one stream keep their order and a batch never
 * waits on another batch's row lock.
 */
import { StoreUnavailable } from './errors.ts';
import type { EncodedEvents } from './event-encoding.ts';
import type { AppendResult, ExpectedVersion, NewEvent } from './types.ts';

export interface PendingAppend {
  streamId: string;
  events: readonly NewEvent[];
  expected: ExpectedVersion;
  /** The events' data and metadata, serialized when the append was made (so a value JSON cannot hold fails its caller alone). */
  encoded: EncodedEvents;
}

export type AppendOutcome = { ok: AppendResult } | { error: Error };

/** `retry`: an `any` append lost a race to another process; it goes into the next batch. */
export type BatchOutcome = AppendOutcome | { retry: true };

export interface GroupCommitOptions {
  /** Runs one batch; returns one outcome per append, in order. Throws when the whole batch failed. */
  execute(batch: PendingAppend[]): Promise<BatchOutcome[]>;
  /** Batches in flight at once (connections used for appends). */
  maxInFlight: number;
  /** Upper bound on events per batch. */
  maxBatchEvents: number;
  /** Told when a whole batch fails. */
  onBatchError?: (error: unknown) => void;
}

/** Below this many queued events a second connection is not worth a second commit. */
const minSplitEvents = 16;

interface Waiting extends PendingAppend {
  resolve(result: AppendResult): void;
  reject(error: unknown): void;
}

export class GroupCommitter {
  readonly #options: GroupCommitOptions;
  #queue: Waiting[] = [];
  #inFlight = 0;
  readonly #busyStreams = new Set<string>();
  #idle: (() => void)[] = [];
  #pumpScheduled = false;

  constructor(options: GroupCommitOptions) {
    this.#options = options;
  }

  append(request: PendingAppend): Promise<AppendResult> {
    return new Promise((resolve, reject) => {
      this.#queue.push({ resolve, reject, ...request });
      this.#schedulePump();
    });
  }

  /** Resolves when nothing is queued or in flight. */
  drained(): Promise<void> {
    if (this.#inFlight === 0 && this.#queue.length === 0) return Promise.resolve();
    return new Promise((resolve) => this.#idle.push(resolve));
  }

  /**
   * Batches leave at the end of this turn of the event loop (a setImmediate), not at the first append:
   * callers woken by the previous batch's acknowledgements append in the same turn, and all of them go
   * in one batch instead of the first going alone. The command handler hands its appends over from a
   * setImmediate of its own, after the socket writes its caller made meanwhile (the engine call that a
   * reservation in a standing slot lease starts alongside its append): on this VM a write to a socket
   * whose reader sleeps costs the writer ~0.5 ms while it wakes that process, and the engine call
   * should not wait for PostgreSQL's wake-up (BENCHMARKS.md, gateway). A caller whose appends of this
   * turn are all made can send them at once (`sendNow`), without waiting for the poll of the next turn.
   */
  #schedulePump(): void {
    if (this.#pumpScheduled) return;
    this.#pumpScheduled = true;
    setImmediate(() => {
      this.#pumpScheduled = false;
      this.#pump();
    });
  }

  /**
   * Sends what is queued now instead of at the end of this turn: for a caller that queued, in one go,
   * every append its turn will make (the command handler's flush, itself run from a setImmediate).
   */
  sendNow(): void {
    if (this.#pumpScheduled) this.#pump();
  }

  #pump(): void {
    while (this.#inFlight < this.#options.maxInFlight && this.#queue.length > 0) {
      // Share what is queued among the free connections so that they work in parallel, but keep
      // batches large enough that a round trip and a commit still serve many appends.
      const free = this.#options.maxInFlight - this.#inFlight;
      let limit = this.#options.maxBatchEvents;
      if (free > 1) {
        let queuedEvents = 0;
        for (const item of this.#queue) queuedEvents += item.events.length;
        limit = Math.min(limit, Math.max(minSplitEvents, Math.ceil(queuedEvents / free)));
      }
      const batch = this.#takeBatch(limit);
      if (batch.length === 0) return; // everything queued waits on a stream already in flight
      this.#inFlight += 1;
      void this.#run(batch);
    }
  }

  #takeBatch(maxEvents: number): Waiting[] {
    const batch: Waiting[] = [];
    const rest: Waiting[] = [];
    const inBatch = new Set<string>();
    let events = 0;
    for (const item of this.#queue) {
      const fits = batch.length === 0 || events + item.events.length <= maxEvents;
      if (fits && !inBatch.has(item.streamId) && !this.#busyStreams.has(item.streamId)) {
        batch.push(item);
        inBatch.add(item.streamId);
        events += item.events.length;
      } else {
        // a later append to a stream held back here must not overtake it
        inBatch.add(item.streamId);
        rest.push(item);
      }
    }
    this.#queue = rest;
    for (const item of batch) this.#busyStreams.add(item.streamId);
    return batch;
  }

  async #run(batch: Waiting[]): Promise<void> {
    try {
      await this.#settle(batch);
    } finally {
      for (const item of batch) this.#busyStreams.delete(item.streamId);
      this.#inFlight -= 1;
      this.#schedulePump();
      if (this.#inFlight === 0 && this.#queue.length === 0) {
        const idle = this.#idle;
        this.#idle = [];
        for (const resolve of idle) resolve();
      }
    }
  }

  async #settle(batch: Waiting[]): Promise<void> {
    let outcomes: BatchOutcome[];
    try {
      outcomes = await this.#options.execute(batch);
    } catch (error) {
      this.#options.onBatchError?.(error);
      // The database is unreachable or silent: every append of the batch fails now, rather than each
      // waiting out the same timeout again alone.
      if (batch.length === 1 || error instanceof StoreUnavailable) {
        for (const item of batch) item.reject(error);
        return;
      }
      // One bad append must not fail its neighbours: retry each alone to find it.
      for (const item of batch) await this.#settle([item]);
      return;
    }
    const again: Waiting[] = [];
    batch.forEach((item, i) => {
      const outcome = outcomes[i];
      if ('ok' in outcome) item.resolve(outcome.ok);
      else if ('error' in outcome) item.reject(outcome.error);
      else again.push(item);
    });
    this.#queue.unshift(...again);
  }
}
