/**
 * Subscribing to EventStoreDB's `$all`: a subscription that hands over batches from a live read (the
 * server's filter passing over ESDB's own events and other types), and the watch of other processes'
 * commits that wakes `onCommit` listeners.
 */
import type { AllStreamResolvedEvent, AllStreamSubscription, EventStoreDBClient } from '@eventstore/db-client';
import type { Client } from './eventstoredb.ts';
import { StoreUnavailable } from './errors.ts';
import { eventTypesRegex, toEsdbPosition, toGlobalPosition, type EsdbPosition } from './eventstoredb-positions.ts';
import { END, START, recordedOf, storeError, type EsdbReads } from './eventstoredb-reads.ts';
import { comparePositions } from './position.ts';
import { logStart, type GlobalPosition, type RecordedEvent, type SubscribeOptions, type Subscription } from './types.ts';
import { WakeHub } from './wake.ts';

/** A subscription stops taking from the server past this many events not yet handed over, per batch size. */
const queuedBatches = 4;

/** What a subscription needs of its log. */
export interface EsdbSubscriptionContext {
  readonly lib: Client;
  readonly client: EventStoreDBClient;
  readonly reads: EsdbReads;
  /** The log's open subscriptions (a subscription adds itself, and leaves at its stop). */
  readonly subscriptions: Set<Subscription>;
}

/** Others' commits, for `onCommit`: one live subscription to `$all`'s end, opened with the first listener. */
export function watchOthers(lib: Client, client: EventStoreDBClient, hub: WakeHub, isOwn: (id: string) => boolean, isClosed: () => boolean): { stop(): Promise<void> } {
  let stopped = false;
  let current: AllStreamSubscription | null = null;
  let scheduled = false;
  let retry: NodeJS.Timeout | undefined;
  const open = () => {
    if (stopped || isClosed()) return;
    const source = client.subscribeToAll({ fromPosition: END, filter: lib.excludeSystemEvents() });
    current = source;
    const again = () => {
      if (current !== source || stopped) return;
      current = null;
      void source.unsubscribe().catch(() => {});
      retry = setTimeout(open, 1000);
    };
    source.on('data', (resolved: AllStreamResolvedEvent) => {
      if (!resolved.event || isOwn(resolved.event.id) || scheduled) return;
      scheduled = true; // one hint per turn for a burst of commits
      setImmediate(() => {
        scheduled = false;
        hub.notify();
      });
    });
    source.on('error', again);
    source.on('end', again);
  };
  open();
  return {
    async stop() {
      stopped = true;
      clearTimeout(retry);
      await current?.unsubscribe().catch(() => {});
      current = null;
    },
  };
}

/** A subscription from `opts.after` (the log\'s start when absent), until it is stopped. */
export function esdbSubscription(c: EsdbSubscriptionContext, opts: SubscribeOptions): Subscription {
  const { lib, client, subscriptions } = c;
  const { head, firstDue } = c.reads;
  const batchSize = opts.batchSize ?? 500;
  const gatherMs = opts.gatherMs ?? 0;
  const retryMs = Math.min(opts.pollIntervalMs ?? 1000, 1000);
  const skip = opts.skipMetadata ?? null;
  const types = opts.eventTypes ? new Set(opts.eventTypes) : null;
  // What the server's filter lets through; `skipMetadata` is applied here, after it.
  const wanted = (e: RecordedEvent) => types === null || types.has(e.type);
  const handed = (e: RecordedEvent) => wanted(e) && !(skip !== null && e.metadata[skip.key] === skip.value);
  const abort = new AbortController();
  const changed = new WakeHub();
  let position = opts.after ?? logStart;
  let queue: ({ event: RecordedEvent } | { checkpoint: GlobalPosition })[] = [];
  let received = position;
  let source = null as AllStreamSubscription | null;
  let failure: unknown = null;
  let busy = false;
  const advance = (to: GlobalPosition) => {
    if (comparePositions(to, position) > 0) position = to;
    changed.notify();
  };

  // From `position`: whatever was queued and not handed over is read again.
  const open = () => {
    queue = [];
    received = position;
    failure = null;
    const checkpointReached = (from: AllStreamSubscription, at: EsdbPosition) => {
      // Only once every event before it has come out of the client's buffer: it then moves past passed-over events.
      if (from !== source || from.readableLength > 0) return;
      const checkpoint = toGlobalPosition(at);
      if (comparePositions(checkpoint, received) <= 0) return;
      queue.push({ checkpoint });
      received = checkpoint;
      changed.notify();
    };
    const filter = types ? lib.eventTypeFilter({ regex: eventTypesRegex([...types]), checkpointReached }) : lib.excludeSystemEvents({ checkpointReached });
    const fromPosition = comparePositions(position, logStart) === 0 ? START : toEsdbPosition(position);
    const current = client.subscribeToAll({ fromPosition, filter });
    source = current;
    const fail = (error: unknown) => {
      if (current !== source || abort.signal.aborted || failure !== null) return;
      failure = error;
      changed.notify();
    };
    current.on('data', (resolved: AllStreamResolvedEvent) => {
      if (current !== source) return;
      let event: RecordedEvent | null;
      try {
        event = recordedOf(resolved);
      } catch (error) {
        fail(error);
        return;
      }
      if (!event || comparePositions(event.globalPosition, received) <= 0) return;
      queue.push({ event });
      received = event.globalPosition;
      if (queue.length >= batchSize * queuedBatches) current.pause();
      changed.notify();
    });
    current.on('error', (error: unknown) => fail(storeError(error, 'the subscription to $all', false)));
    current.on('end', () => fail(new StoreUnavailable('EventStoreDB ended the subscription to $all', false)));
  };

  const pause = (ms: number) =>
    new Promise<void>((resolve) => {
      if (abort.signal.aborted) return resolve();
      const done = () => {
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(done, ms);
      abort.signal.addEventListener('abort', done, { once: true });
    });

  const loop = (async () => {
    open();
    while (!abort.signal.aborted) {
      if (failure !== null) {
        const error = failure;
        const dropped = source;
        source = null;
        await dropped?.unsubscribe().catch(() => {});
        opts.onError?.(error);
        await pause(retryMs);
        if (abort.signal.aborted) break;
        open();
        continue;
      }
      if (queue.length === 0) {
        const generation = changed.generation;
        if (queue.length === 0 && failure === null) await changed.wait(generation, 60_000, abort.signal);
        continue;
      }
      const taken = queue.splice(0, batchSize);
      const last = taken[taken.length - 1];
      const end = 'event' in last ? last.event.globalPosition : last.checkpoint;
      const batch = taken.flatMap((item) => ('event' in item && handed(item.event) ? [item.event] : []));
      if (source?.isPaused() && queue.length < batchSize) source.resume();
      busy = true;
      try {
        while (batch.length > 0 && !abort.signal.aborted) {
          try {
            await opts.handle(batch);
            break;
          } catch (error) {
            opts.onError?.(error);
            await pause(retryMs);
          }
        }
      } finally {
        busy = false;
      }
      if (abort.signal.aborted) break;
      advance(end);
      // Caught up: let the next events gather for a moment rather than hand them over a commit at a time.
      if (queue.length === 0 && gatherMs > 0) await pause(gatherMs);
    }
  })();

  const subscription: Subscription = {
    get position() {
      return position;
    },
    async caughtUp() {
      const target = await head();
      for (;;) {
        if (abort.signal.aborted) throw new Error('subscription stopped');
        if (comparePositions(position, target) >= 0) return;
        const generation = changed.generation;
        if (queue.length === 0 && !busy && failure === null) {
          // Nothing to hand over: if no event this subscription takes lies up to the target, the server's filter passed over the rest.
          const due = await firstDue(position, target, wanted);
          if (due === null) {
            advance(target);
            return;
          }
        }
        await changed.wait(generation, 25, abort.signal);
      }
    },
    async stop() {
      abort.abort();
      changed.notify();
      const current = source;
      source = null;
      await current?.unsubscribe().catch(() => {});
      await loop;
      subscriptions.delete(subscription);
    },
  };
  subscriptions.add(subscription);
  return subscription;
}
