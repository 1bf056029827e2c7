/**
 * Reading EventStoreDB: a read bounded client-side, a stream's revisions and version, `$all` forwards
 * and its end; and the client's events and errors as the log's.
 */
import type { AllStreamResolvedEvent, EventStoreDBClient, ResolvedEvent, StreamingRead } from '@eventstore/db-client';
import { StoreClosed, StoreUnavailable } from './errors.ts';
import { isSystemEvent, toEsdbPosition, toGlobalPosition, versionOf, type EsdbPosition } from './eventstoredb-positions.ts';
import { comparePositions } from './position.ts';
import { logStart, type GlobalPosition, type RecordedEvent } from './types.ts';

// The client's constants (their values), so that nothing of it is loaded before a log is opened.
export const START = 'start';
export const END = 'end';
export const FORWARDS = 'forwards';
export const BACKWARDS = 'backwards';
export const pageSize = 1000;

/** The reads of one log. */
export type EsdbReads = ReturnType<typeof esdbReads>;

/** The reads over `client`; `ensureOpen` throws once the log is closed. */
export function esdbReads(client: EventStoreDBClient, readTimeoutMs: number, ensureOpen: () => void) {
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

  return { collect, readRevisions, versionNow, readAll, head, firstDue };
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
export function isCommandError(error: unknown, type?: string): boolean {
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
