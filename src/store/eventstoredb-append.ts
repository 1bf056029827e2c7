/**
 * Appending to EventStoreDB: one append per stream at a time from this process, each remembered so that
 * a repeat the server answers without writing is told apart, and a resend after an unknown outcome
 * first looks for the events where the first sending put them.
 */
import type { Client } from './eventstoredb.ts';
import type { EventStoreDBClient, JSONType, WrongExpectedVersionError } from '@eventstore/db-client';
import { DuplicateEventId, StoreUnavailable, WrongExpectedVersion } from './errors.ts';
import { actualVersionOf, toExpectedRevision, toGlobalPosition, versionOf } from './eventstoredb-positions.ts';
import { BACKWARDS, END, isCommandError, recordedOf, storeError, type EsdbReads } from './eventstoredb-reads.ts';
import { logStart, type AppendResult, type ExpectedVersion, type GlobalPosition, type NewEvent, type RecordedEvent } from './types.ts';
import type { WakeHub } from './wake.ts';

/** Appends and ids remembered per process (idempotency, own commits): bounded, oldest dropped first. */
const remembered = 10_000;

interface StoredAppend {
  streamId: string;
  ids: string;
  nextExpectedVersion: number;
  lastPosition: GlobalPosition;
}

/** What the appends of one log share with it. */
export interface EsdbAppendContext {
  readonly lib: Client;
  readonly client: EventStoreDBClient;
  readonly reads: EsdbReads;
  readonly deadlineMs: number;
  readonly hub: WakeHub;
  readonly onAppend?: (ms: number) => void;
}

/** The appends of one log: `append` stores now (callers keep one per stream at a time), `isOwn` tells this process's events. */
export function esdbAppends(c: EsdbAppendContext) {
  const { lib, client, deadlineMs, hub } = c;
  const { collect, readRevisions } = c.reads;
  // Appends this process stored (first event id -> where), to tell a repeat the server answered without writing.
  const stored = new Map<string, StoredAppend>();
  // Appends whose outcome is unknown (the connection failed after sending): a resend first looks for them.
  const unknownOutcome = new Map<string, { streamId: string; ids: string }>();
  const ownIds = new Set<string>();
  const remember = <K, V>(map: Map<K, V> | Set<K>, key: K, value?: V) => {
    map.delete(key);
    if (map instanceof Map) map.set(key, value as V);
    else map.add(key);
    if (map.size > remembered) map.delete(map.keys().next().value as K);
  };

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
      c.onAppend?.(performance.now() - sent);
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

  return { appendNow, isOwn: (id: string) => ownIds.has(id) };
}
