/**
 * The event log port over EventStoreDB/KurrentDB (the official gRPC client, @eventstore/db-client):
 * streams are ESDB streams, the global log is `$all` without ESDB's own `$` events, and positions are
 * `$all`'s {commit, prepare} in the GlobalPosition shape (eventstoredb-positions.ts). It is a log only:
 * projections, checkpoints and workflow processors keep their rows in a SQL database beside it
 * (`{ log, db, checkpoints: sqlCheckpoints(db) }`, see docs/event-store.md, "EventStoreDB /
 * KurrentDB as the log"), where the differences from the SQL adapters are listed. Reads are in eventstoredb-reads.ts,
 * appends in eventstoredb-append.ts, subscriptions in eventstoredb-subscription.ts.
 */
import type { EventStoreDBClient } from '@eventstore/db-client';
import { StoreClosed } from './errors.ts';
import { esdbAppends } from './eventstoredb-append.ts';
import { validateAppend } from './eventstoredb-positions.ts';
import { BACKWARDS, END, esdbReads, pageSize } from './eventstoredb-reads.ts';
import { esdbSubscription, watchOthers } from './eventstoredb-subscription.ts';
import { comparePositions } from './position.ts';
import { logStart, type EventLog, type PingResult, type StreamRead, type SubscribeOptions, type Subscription } from './types.ts';
import { WakeHub } from './wake.ts';

/** The client, loaded when a log is opened: its gRPC and protobuf code costs a process about 0.2 s to load. */
export type Client = typeof import('@eventstore/db-client');

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

function eventStoreDbLog(lib: Client, client: EventStoreDBClient, options: OpenEventStoreDbLogOptions): EventStoreDbLog {
  const deadlineMs = options.deadlineMs ?? 10_000;
  const readTimeoutMs = options.readTimeoutMs ?? 10_000;
  let closed = false;
  const subscriptions = new Set<Subscription>();
  // One append per stream at a time from this process: they reach the server in call order, as the SQL adapters' do.
  const tails = new Map<string, Promise<unknown>>();
  const hub = new WakeHub();
  let watcher: { stop(): Promise<void> } | null = null;

  const ensureOpen = () => {
    if (closed) throw new StoreClosed();
  };
  const reads = esdbReads(client, readTimeoutMs, ensureOpen);
  const { collect, readRevisions, versionNow, readAll, head } = reads;
  const { appendNow, isOwn } = esdbAppends({ lib, client, reads, deadlineMs, hub, onAppend: options.onAppend });

  function subscribe(opts: SubscribeOptions): Subscription {
    ensureOpen();
    return esdbSubscription({ lib, client, reads, subscriptions }, opts);
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
      watcher ??= watchOthers(lib, client, hub, isOwn, () => closed);
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

export { recordedOf, storeError } from './eventstoredb-reads.ts';
