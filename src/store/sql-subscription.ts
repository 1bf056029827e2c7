/**
 * A subscription to the global log over SQL: a loop that reads a page after its position (only the
 * events it is handed, when it passes some over), hands it over, and waits for a commit's wake-up, a
 * poll, or (when commits wait behind an older transaction) a short recheck.
 */
import type { AsyncLocalStorage } from 'node:async_hooks';
import { comparePositions } from './position.ts';
import { pendingRecheckMs } from './sql-read.ts';
import { logStart, type GlobalPosition, type NewEvent, type RecordedEvent, type SubscribeOptions, type Subscription } from './types.ts';
import { WakeHub } from './wake.ts';

/** What a subscription needs of its store. */
export interface SubscriptionSource {
  readAll(after: GlobalPosition, limit: number): Promise<RecordedEvent[]>;
  readPage(after: GlobalPosition, limit: number, skip: { key: string; value: string } | null, types: readonly string[] | null): Promise<{ events: RecordedEvent[]; scanned: number }>;
  lastCommitted(): Promise<GlobalPosition>;
  /** Told of every commit: with its events when this process made it, with null for another process's hint. */
  readonly commitListeners: Set<(events: readonly (readonly NewEvent[])[] | null) => void>;
  /** The store's open subscriptions (a subscription adds itself, and leaves at its stop). */
  readonly subscriptions: Set<{ stop(): Promise<void> }>;
  /** Set while one of the store's `transaction` callbacks runs (null: not tracked). */
  readonly insideTransaction: AsyncLocalStorage<boolean> | null;
  readonly pollIntervalMs: number;
  readonly closed: boolean;
}

function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}

/** A subscription from `opts.after` (the log's start when absent), until it is stopped. */
export function sqlSubscription(source: SubscriptionSource, opts: SubscribeOptions): Subscription {
  const { readAll, readPage, lastCommitted, commitListeners, subscriptions, insideTransaction } = source;
  const batchSize = opts.batchSize ?? 500;
  const poll = opts.pollIntervalMs ?? source.pollIntervalMs;
  const gatherMs = opts.gatherMs ?? 0;
  const skip = opts.skipMetadata ?? null;
  const types = opts.eventTypes ?? null;
  /** Some events are passed over: pages come from `readPage`, and its passed-over last event is not handed. */
  const filtered = skip !== null || types !== null;
  // Woken by another process's hint, and by this process's commits unless every event of one is passed over.
  const wakes = new WakeHub();
  const passedOver = (event: NewEvent) => (skip !== null && event.metadata?.[skip.key] === skip.value) || (types !== null && !types.includes(event.type));
  const onCommit = (events: readonly (readonly NewEvent[])[] | null) => {
    if (events === null || !events.every((list) => list.every(passedOver))) wakes.notify();
  };
  commitListeners.add(onCommit);
  const abort = new AbortController();
  let position = opts.after ?? logStart;
  let waiters: { target: GlobalPosition; resolve(): void; reject(e: unknown): void }[] = [];
  const settleWaiters = () => {
    waiters = waiters.filter((w) => {
      if (comparePositions(position, w.target) < 0) return true;
      w.resolve();
      return false;
    });
  };

  // Outside any transaction the caller may be in: the loop outlives it.
  const follow = async () => {
    let shortDelay = 0;
    /** The last wait ended on the poll's timeout, with nothing pending and no wake-up meanwhile. */
    let quiet = false;
    while (!abort.signal.aborted) {
      const generation = wakes.generation;
      let batch: RecordedEvent[];
      let scanned: number;
      let pending = false;
      try {
        ({ events: batch, scanned } = filtered ? await readPage(position, batchSize, skip, types) : await readAll(position, batchSize).then((events) => ({ events, scanned: events.length })));
        const handed = filtered ? batch.filter((e) => e.metadata !== null) : batch;
        if (handed.length > 0) await opts.handle(handed);
        // Nothing readable: has something committed that an older transaction still hides? Asked after
        // a wake-up, a batch, a recheck or for a `caughtUp` waiter, not after a poll nothing woke (idle,
        // that was one query more per subscription a second): such commits are found by the next read.
        else if (scanned === 0 && (!quiet || waiters.length > 0)) pending = comparePositions(await lastCommitted(), position) > 0;
      } catch (error) {
        quiet = false;
        if (abort.signal.aborted || source.closed) break;
        opts.onError?.(error);
        await pause(Math.min(poll, 1000), abort.signal);
        continue;
      }
      if (batch.length > 0) {
        quiet = false;
        position = batch[batch.length - 1].globalPosition;
        shortDelay = 0;
        settleWaiters();
        // Caught up: let the next events gather for a moment rather than read them a commit at a time.
        if (scanned < batchSize && gatherMs > 0) await pause(gatherMs, abort.signal);
        continue;
      }
      // Commits wait behind an older transaction, whose end sends no hint: re-read at 5, 10, 20, 40,
      // 40 ... ms until they can be read, rather than at the next poll. A hint still wakes it at once.
      shortDelay = pending ? Math.min(shortDelay === 0 ? 5 : shortDelay * 2, pendingRecheckMs, poll) : 0;
      await wakes.wait(generation, pending ? shortDelay : poll, abort.signal);
      quiet = !pending && wakes.generation === generation;
    }
  };
  const loop = insideTransaction ? insideTransaction.exit(follow) : follow();

  const subscription: Subscription = {
    get position() {
      return position;
    },
    async caughtUp() {
      const target = await lastCommitted();
      if (comparePositions(position, target) >= 0) return;
      if (abort.signal.aborted) throw new Error('subscription stopped');
      await new Promise<void>((resolve, reject) => waiters.push({ target, resolve, reject }));
    },
    async stop() {
      abort.abort();
      commitListeners.delete(onCommit);
      await loop;
      subscriptions.delete(subscription);
      for (const w of waiters) w.reject(new Error('subscription stopped'));
      waiters = [];
    },
  };
  subscriptions.add(subscription);
  return subscription;
}
