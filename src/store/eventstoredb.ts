/**
 * The event log port over EventStoreDB/KurrentDB (the official gRPC client, @eventstore/db-client):
 * streams are ESDB streams, the global log is `$all` without ESDB's own `$` events, and positions are
 * `$all`'s {commit, prepare} in the GlobalPosition shape (eventstoredb-positions.ts). It is a log only:
 * projections, checkpoints and workflow processors keep their rows in a SQL database beside it
 * (`{ log, db, checkpoints: sqlCheckpoints(db) }`, see docs/event-store.md, "EventStoreDB / KurrentDB
 * as the log"), where the differences from the SQL adapters are listed.
 */
import type {
  AllStreamResolvedEvent,
  AllStreamSubscription,
  EventStoreDBClient,
  JSONType,
  ResolvedEvent,
  StreamingRead,
  WrongExpectedVersionError,
} from '@eventstore/db-client';
import { DuplicateEventId, StoreClosed, StoreUnavailable, WrongExpectedVersion } from './errors.ts';
import {
  actualVersionOf,
  eventTypesRegex,
  isSystemEvent,
  toEsdbPosition,
  toExpectedRevision,
  toGlobalPosition,
  validateAppend,
  versionOf,
  type EsdbPosition,
} from './eventstoredb-positions.ts';
import { comparePositions } from './position.ts';
import {
  logStart,
  type AppendResult,
  type EventLog,
  type ExpectedVersion,
  type GlobalPosition,
  type NewEvent,
  type PingResult,
  type RecordedEvent,
  type StreamRead,
  type SubscribeOptions,
  type Subscription,
} from './types.ts';
import { WakeHub } from './wake.ts';

/** The client, loaded when a log is opened: its gRPC and protobuf code costs a process about 0.2 s to load. */
type Client = typeof import('@eventstore/db-client');

// The client's constants (their values), so that nothing of it is loaded before a log is opened.
const START = 'start';
const END = 'end';
const FORWARDS = 'forwards';
const BACKWARDS = 'backwards';

export interface OpenEventStoreDbLogOptions {
  /** The client's connection string, e.g. `esdb://127.0.0.1:2113?tls=false` (EVENTSTORE_URL). */
  url: string;
  /** An append's deadline, sent to the server and kept client-side one second later (default 10,000 ms). */
  deadlineMs?: number;
  /** A read's bound, client-side: the client gives reads of `$all` and of streams no deadline (default 10,000 ms). */
  readTimeoutMs?: number;
  /** Told how long each append took to be acknowledged (ms), for /metrics (as the SQL adapters' group commits are). */
  onAppend?: (ms: number) => void;
}

/** The ESDB log: the `EventLog` port, and a ping for /health. */
export interface EventStoreDbLog extends EventLog {
  readonly adapter: 'eventstoredb';
  /** A cheap read of `$all`'s last event, bounded by a timeout. */
  ping(timeoutMs?: number): Promise<PingResult>;
}

/** Appends and ids remembered per process (idempotency, own commits): bounded, oldest dropped first. */
const remembered = 10_000;
/** A subscription stops taking from the server past this many events not yet handed over, per batch size. */
const queuedBatches = 4;
const pageSize = 1000;

/**
 * Opens the log on an EventStoreDB/KurrentDB server and reads `$all`'s last event once, so a wrong
 * URL or a server that does not answer fails here (StoreUnavailable), not at the first append.
 */
export async function openEventStoreDbLog(options: OpenEventStoreDbLogOptions): Promise<EventStoreDbLog> {
  const lib: Client = await import('@eventstore/db-client');
  const client = lib.EventStoreDBClient.connectionString(options.url);
  const log = eventStoreDbLog(lib, client, options);
  try {
    await log.head();
  } catch (error) {
    await log.close().catch(() => {});
    throw error;
  }
  return log;
}

interface StoredAppend {
  streamId: string;
  ids: string;
  nextExpectedVersion: number;
  lastPosition: GlobalPosition;
}

function eventStoreDbLog(lib: Client, client: EventStoreDBClient, options: OpenEventStoreDbLogOptions): EventStoreDbLog {
  const deadlineMs = options.deadlineMs ?? 10_000;
  const readTimeoutMs = options.readTimeoutMs ?? 10_000;
  let closed = false;
  const subscriptions = new Set<Subscription>();
  // One append per stream at a time from this process: they reach the server in call order, as the SQL adapters' do.
  const tails = new Map<string, Promise<unknown>>();
  // Appends this process stored (first event id -> where), to tell a repeat the server answered without writing.
  const stored = new Map<string, StoredAppend>();
  // Appends whose outcome is unknown (the connection failed after sending): a resend first looks for them.
  const unknownOutcome = new Map<string, { streamId: string; ids: string }>();
  const ownIds = new Set<string>();
  const hub = new WakeHub();
  let watcher: { stop(): Promise<void> } | null = null;

  const ensureOpen = () => {
    if (closed) throw new StoreClosed();
  };
  const remember = <K, V>(map: Map<K, V> | Set<K>, key: K, value?: V) => {
    map.delete(key);
    if (map instanceof Map) map.set(key, value as V);
    else map.add(key);
    if (map.size > remembered) map.delete(map.keys().next().value as K);
  };

  /** Every event of a read, or StoreUnavailable once the read has taken `readTimeoutMs`. */
  async function collect<T>(what: string, stream: StreamingRead<T>, timeoutMs = readTimeoutMs): Promise<T[]> {
    const out: T[] = [];
    let timer: NodeJS.Timeout | undefined;
    const reading = (async () => {
      for await (const item of stream) out.push(item);
    })();
    const limit = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        void stream.cancel().catch(() => {});
        reject(new StoreUnavailable(`EventStoreDB: ${what} got no answer within ${timeoutMs} ms`, false));
      }, timeoutMs);
    });
    reading.catch(() => {}); // a read cut by the timeout fails later, unheard
    try {
      await Promise.race([reading, limit]);
      return out;
    } catch (error) {
      throw storeError(error, what, false);
    } finally {
      clearTimeout(timer);
    }
  }

  /** The events of a stream from a revision, forwards; null when the stream does not exist. */
  async function readRevisions(streamId: string, fromRevision: bigint, maxCount: number): Promise<RecordedEvent[] | null> {
    try {
      const read = await collect(`reading ${streamId}`, client.readStream(streamId, { fromRevision, maxCount, direction: FORWARDS }));
      return read.map(recordedOf).filter((e): e is RecordedEvent => e !== null);
    } catch (error) {
      if (isCommandError(error, 'stream-not-found')) return null;
      throw error;
    }
  }

  /** The stream's version: its last event's revision + 1, 0 when it has none. */
  async function versionNow(streamId: string): Promise<number> {
    try {
      const [last] = await collect(`the version of ${streamId}`, client.readStream(streamId, { fromRevision: END, direction: BACKWARDS, maxCount: 1 }));
      return last?.event ? versionOf(last.event.revision) : 0;
    } catch (error) {
      if (isCommandError(error, 'stream-not-found')) return 0;
      throw error;
    }
  }

  /** Up to `limit` events of the log after `after`, in `$all` order (ESDB's own events passed over). */
  async function readAll(after: GlobalPosition, limit: number): Promise<RecordedEvent[]> {
    ensureOpen();
    if (!Number.isSafeInteger(limit) || limit < 0) throw new TypeError(`readAll: invalid limit ${limit}`);
    const out: RecordedEvent[] = [];
    let cursor = after;
    while (out.length < limit) {
      // A read of $all from a position includes the event there: one more, and that one dropped.
      const want = Math.min(limit - out.length, pageSize) + 1;
      const fromPosition = comparePositions(cursor, logStart) === 0 ? START : toEsdbPosition(cursor);
      const page = await collect('reading $all', client.readAll({ fromPosition, maxCount: want, direction: FORWARDS }));
      let moved = false;
      for (const resolved of page) {
        if (!resolved.event) continue;
        const position = toGlobalPosition(resolved.event.position);
        if (comparePositions(position, cursor) <= 0) continue;
        cursor = position;
        moved = true;
        const event = recordedOf(resolved);
        if (event && out.length < limit) out.push(event);
      }
      if (page.length < want || !moved) break;
    }
    return out;
  }

  /** The last event of the log (ESDB's own passed over), read backwards from `$all`'s end. */
  async function head(): Promise<GlobalPosition> {
    ensureOpen();
    let from: EsdbPosition | typeof END = END;
    for (let maxCount = 32; ; maxCount = Math.min(maxCount * 4, pageSize)) {
      const page: AllStreamResolvedEvent[] = await collect('reading the end of $all', client.readAll({ fromPosition: from, direction: BACKWARDS, maxCount }));
      for (const resolved of page) {
        const event = recordedOf(resolved);
        if (event) return event.globalPosition;
      }
      const last = page.at(-1)?.event;
      if (page.length < maxCount || !last) return logStart;
      // Only ESDB's own events so far: read on from before the last of them (a page that did not move ends the search).
      if (from !== END && comparePositions(toGlobalPosition(last.position), toGlobalPosition(from)) >= 0) return logStart;
      from = last.position;
    }
  }

  /** The first event after `after` and at or before `until` that passes `wanted`, or null. */
  async function firstDue(after: GlobalPosition, until: GlobalPosition, wanted: (e: RecordedEvent) => boolean): Promise<RecordedEvent | null> {
    for (let cursor = after; ; ) {
      const page = await readAll(cursor, pageSize);
      for (const event of page) {
        if (comparePositions(event.globalPosition, until) > 0) return null;
        if (wanted(event)) return event;
      }
      if (page.length < pageSize) return null;
      cursor = page[page.length - 1].globalPosition;
    }
  }

  /** A resend after an unknown outcome: are these events already where the first sending put them? */
  async function alreadyStored(streamId: string, events: readonly NewEvent[], expected: ExpectedVersion): Promise<AppendResult | null> {
    const ids = events.map((e) => e.id.toLowerCase());
    let candidates: RecordedEvent[];
    if (typeof expected === 'number' || expected === 'no_stream') {
      candidates = (await readRevisions(streamId, BigInt(expected === 'no_stream' ? 0 : expected), ids.length)) ?? [];
    } else {
      // `any` or `stream_exists`: the first sending went on top of whatever the stream held then; look back a while.
      const back = await collect(`reading ${streamId}`, client.readStream(streamId, { fromRevision: END, direction: BACKWARDS, maxCount: 256 })).catch((error) => {
        if (isCommandError(error, 'stream-not-found')) return [];
        throw error;
      });
      const read = back.map(recordedOf).filter((e): e is RecordedEvent => e !== null).reverse();
      const at = read.findIndex((e) => e.id === ids[0]);
      candidates = at < 0 ? [] : read.slice(at, at + ids.length);
    }
    if (candidates.length !== ids.length || candidates.some((e, i) => e.id !== ids[i])) return null;
    const last = candidates[candidates.length - 1];
    return { nextExpectedVersion: last.streamVersion, lastPosition: last.globalPosition, idempotent: true };
  }

  /**
   * ESDB answers a repeat of some of these ids at this place (the server's "corrupted idempotency")
   * with a wrong expected version; the SQL adapters call it a duplicate. Anything else is a conflict.
   */
  async function conflictError(streamId: string, events: readonly NewEvent[], expected: ExpectedVersion, actual: number): Promise<Error> {
    if (expected === 'any' || (expected === 'stream_exists' && actual > 0)) return new DuplicateEventId(streamId, actual);
    const at = expected === 'no_stream' ? 0 : typeof expected === 'number' ? expected : null;
    if (at !== null && actual > at) {
      const [next] = (await readRevisions(streamId, BigInt(at), 1)) ?? [];
      const ids = new Set(events.map((e) => e.id.toLowerCase()));
      if (next && ids.has(next.id)) return new DuplicateEventId(streamId, actual);
    }
    return new WrongExpectedVersion(streamId, expected, actual);
  }

  async function appendNow(streamId: string, events: readonly NewEvent[], expected: ExpectedVersion): Promise<AppendResult> {
    const key = events[0].id.toLowerCase();
    const ids = events.map((e) => e.id.toLowerCase()).join(',');
    const unsure = unknownOutcome.get(key);
    if (unsure && unsure.streamId === streamId && unsure.ids === ids) {
      const found = await alreadyStored(streamId, events, expected);
      if (found) {
        unknownOutcome.delete(key);
        remember(stored, key, { streamId, ids, nextExpectedVersion: found.nextExpectedVersion, lastPosition: found.lastPosition });
        return found;
      }
    }
    // Serialised here, where a value JSON cannot hold throws: inside the client it would leave the append unsettled.
    const proposed = events.map((e) => {
      if (JSON.stringify(e.data) === undefined) throw new TypeError(`append to ${streamId}: event data must be a JSON value`);
      JSON.stringify(e.metadata ?? {});
      return lib.jsonEvent({ id: e.id, type: e.type, data: e.data as JSONType, metadata: (e.metadata ?? {}) as JSONType });
    });
    let timer: NodeJS.Timeout | undefined;
    const sent = performance.now();
    try {
      const sending = client.appendToStream(streamId, proposed, { expectedRevision: toExpectedRevision(expected), deadline: deadlineMs });
      sending.catch(() => {}); // after a client-side timeout its own failure comes unheard
      const result = await Promise.race([
        sending,
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new StoreUnavailable(`EventStoreDB: append to ${streamId} got no answer within ${deadlineMs + 1000} ms`, true)), deadlineMs + 1000);
        }),
      ]);
      unknownOutcome.delete(key);
      options.onAppend?.(performance.now() - sent);
      const nextExpectedVersion = versionOf(result.nextExpectedRevision);
      const earlier = stored.get(key);
      // The server stores a repeat of ids at their place once; it answers with where they already are.
      if (earlier && earlier.streamId === streamId && earlier.ids === ids && earlier.nextExpectedVersion === nextExpectedVersion) {
        return { nextExpectedVersion, lastPosition: earlier.lastPosition, idempotent: true };
      }
      // The position ESDB answers with is its last event's (the prepare that ends the write).
      const lastPosition = result.position
        ? toGlobalPosition(result.position)
        : ((await readRevisions(streamId, result.nextExpectedRevision, 1)) ?? [])[0]?.globalPosition ?? logStart;
      remember(stored, key, { streamId, ids, nextExpectedVersion, lastPosition });
      for (const e of events) remember(ownIds, e.id.toLowerCase());
      hub.notify();
      return { nextExpectedVersion, lastPosition, idempotent: false };
    } catch (error) {
      if (isCommandError(error, 'wrong-expected-version')) {
        unknownOutcome.delete(key);
        throw await conflictError(streamId, events, expected, actualVersionOf((error as WrongExpectedVersionError).actualVersion));
      }
      const mapped = storeError(error, `append to ${streamId}`, true);
      if (mapped instanceof StoreUnavailable) remember(unknownOutcome, key, { streamId, ids });
      throw mapped;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Others' commits, for `onCommit`: one live subscription to `$all`'s end, opened with the first listener. */
  function watchOthers(): { stop(): Promise<void> } {
    let stopped = false;
    let current: AllStreamSubscription | null = null;
    let scheduled = false;
    let retry: NodeJS.Timeout | undefined;
    const open = () => {
      if (stopped || closed) return;
      const source = client.subscribeToAll({ fromPosition: END, filter: lib.excludeSystemEvents() });
      current = source;
      const again = () => {
        if (current !== source || stopped) return;
        current = null;
        void source.unsubscribe().catch(() => {});
        retry = setTimeout(open, 1000);
      };
      source.on('data', (resolved: AllStreamResolvedEvent) => {
        if (!resolved.event || ownIds.has(resolved.event.id) || scheduled) return;
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

  function subscribe(opts: SubscribeOptions): Subscription {
    ensureOpen();
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

  const log: EventStoreDbLog = {
    adapter: 'eventstoredb',
    start: logStart,
    comparePositions,

    async append(streamId, events, expected) {
      ensureOpen();
      validateAppend(streamId, events, expected);
      const previous = tails.get(streamId) ?? Promise.resolve();
      const appending = previous.then(() => appendNow(streamId, events, expected));
      const tail = appending.catch(() => {});
      tails.set(streamId, tail);
      void tail.then(() => {
        if (tails.get(streamId) === tail) tails.delete(streamId);
      });
      return appending;
    },

    async readStream(streamId, { fromVersion = 1, limit } = {}) {
      ensureOpen();
      const from = Math.max(fromVersion, 1);
      const events = limit === 0 ? [] : await readRevisions(streamId, BigInt(from - 1), limit ?? Number.MAX_SAFE_INTEGER);
      if (events === null) return { version: 0, events: [] } satisfies StreamRead;
      // A read that reached the stream's end knows its version; otherwise ask for the last event's (read after, never older).
      const reachedEnd = events.length > 0 && (limit === undefined || events.length < limit);
      const version = reachedEnd ? events[events.length - 1].streamVersion : await versionNow(streamId);
      return { version, events } satisfies StreamRead;
    },

    async streamVersions(streamIds) {
      ensureOpen();
      const versions = new Map<string, number>();
      // One read per stream (ESDB has no multi-stream read), 16 at a time.
      for (let i = 0; i < streamIds.length; i += 16) {
        const slice = streamIds.slice(i, i + 16);
        const read = await Promise.all(slice.map((id) => versionNow(id)));
        slice.forEach((id, j) => versions.set(id, read[j]));
      }
      return versions;
    },

    readAll,
    head,

    async readable() {
      // $all on the leader is read-your-writes: an acknowledged append is already readable.
      ensureOpen();
    },

    async countAfter(after) {
      ensureOpen();
      let count = 0;
      for (let cursor = after; ; ) {
        const page = await readAll(cursor, pageSize);
        count += page.length;
        if (page.length < pageSize) return count;
        cursor = page[page.length - 1].globalPosition;
      }
    },

    subscribe,

    onCommit(listener) {
      ensureOpen();
      watcher ??= watchOthers();
      return hub.on(listener);
    },

    async ping(timeoutMs = 1000) {
      const started = performance.now();
      try {
        ensureOpen();
        await collect('ping', client.readAll({ fromPosition: END, direction: BACKWARDS, maxCount: 1 }), timeoutMs);
        return { ok: true, latencyMs: Math.round((performance.now() - started) * 100) / 100 };
      } catch (error) {
        return { ok: false, latencyMs: Math.round((performance.now() - started) * 100) / 100, error: (error as Error).message };
      }
    },

    async close() {
      if (closed) return;
      closed = true;
      for (const s of [...subscriptions]) await s.stop();
      await watcher?.stop();
      await Promise.all([...tails.values()]);
      await client.dispose();
    },
  };
  return log;
}

/** A client event as the log's, or null for ESDB's own events (and a link that resolves to none). */
export function recordedOf(resolved: ResolvedEvent | AllStreamResolvedEvent): RecordedEvent | null {
  const event = resolved.event;
  if (!event || isSystemEvent(event.type, event.streamId)) return null;
  if (!event.position) throw new Error(`EventStoreDB gave event ${event.id} of ${event.streamId} without its position: a server of version 22.6 or later is needed`);
  const metadata = event.metadata;
  return {
    id: event.id,
    type: event.type,
    // Events another client wrote as binary are handed over as their bytes.
    data: event.data,
    metadata: metadata !== null && typeof metadata === 'object' && !Array.isArray(metadata) && !(metadata instanceof Uint8Array) ? (metadata as Record<string, unknown>) : {},
    streamId: event.streamId,
    streamVersion: versionOf(event.revision),
    globalPosition: toGlobalPosition(event.position),
    recordedAt: event.created,
  };
}

/** The client's errors carry their kind in `type` (its ErrorType's values). */
function isCommandError(error: unknown, type?: string): boolean {
  const kind = error instanceof Error ? (error as { type?: unknown }).type : undefined;
  return typeof kind === 'string' && (type === undefined || kind === type);
}

/** A call that failed or got no answer (the outcome of an append then unknown), not a refusal. */
const unavailable = new Set<string>(['unavailable', 'deadline-exceeded', 'timeout', 'cancelled', 'not-leader', 'unknown']);

/**
 * The client's failures as the store's: a connection that failed or did not answer is StoreUnavailable
 * (`outcomeUnknown` for an append, which may have been stored); a refusal (access, a deleted stream, a
 * wrong expected version) is passed on as the client's typed error.
 */
export function storeError(error: unknown, what: string, sent: boolean): unknown {
  if (error instanceof StoreUnavailable || error instanceof StoreClosed) return error;
  // A command error by its type; a gRPC failure the client did not convert by its status code.
  const transport = isCommandError(error) ? unavailable.has((error as { type: string }).type) : typeof (error as { code?: unknown } | null)?.code === 'number';
  if (transport) {
    return new StoreUnavailable(`EventStoreDB: ${what} failed: ${(error as Error).message}`, sent, { cause: error });
  }
  return error;
}
