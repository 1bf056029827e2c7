/**
 * The pure mappings between this store's log port and EventStoreDB/KurrentDB: positions, versions,
 * expected versions, which events of `$all` are the log's, and the checks an append passes before it
 * is sent. No client, no server: unit-tested on their own (test/store/eventstoredb.test.ts).
 */
import { InvalidEvent } from './errors.ts';
import { storableText } from './event-encoding.ts';
import type { ExpectedVersion, GlobalPosition, NewEvent } from './types.ts';

/** A place in EventStoreDB's transaction file, as the client gives it. */
export interface EsdbPosition {
  commit: bigint;
  prepare: bigint;
}

/** Expected revisions as the client takes them: its constants' values, or the last event's revision. */
export type EsdbExpectedRevision = 'any' | 'no_stream' | 'stream_exists' | bigint;

const maxSafe = BigInt(Number.MAX_SAFE_INTEGER);

/**
 * `$all`'s {commit, prepare} as a GlobalPosition: commit as `transactionId`, prepare as `position`.
 * Both order the same way (commit first, then prepare), so `comparePositions` and the checkpoint
 * table's (xid8, bigint) columns keep ESDB's order. They are byte offsets in the transaction file:
 * safe integers up to 8 PiB; beyond, or negative, this throws rather than lose a digit.
 */
export function toGlobalPosition(position: EsdbPosition): GlobalPosition {
  const { commit, prepare } = position;
  if (commit < 0n || prepare < 0n || commit > maxSafe || prepare > maxSafe) {
    throw new RangeError(`EventStoreDB position ${commit}/${prepare} is not a pair of safe integers: it cannot be kept as a GlobalPosition`);
  }
  return { transactionId: Number(commit), position: Number(prepare) };
}

export function toEsdbPosition(position: GlobalPosition): EsdbPosition {
  const { transactionId, position: prepare } = position;
  if (!Number.isSafeInteger(transactionId) || !Number.isSafeInteger(prepare) || transactionId < 0 || prepare < 0) {
    throw new RangeError(`${transactionId}/${prepare} is not an EventStoreDB position`);
  }
  return { commit: BigInt(transactionId), prepare: BigInt(prepare) };
}

/**
 * Our expected version as ESDB's expected revision. Versions count a stream's events from 1 and
 * revisions number them from 0: version N is revision N - 1, and version 0 (an empty stream) is
 * `no_stream`.
 */
export function toExpectedRevision(expected: ExpectedVersion): EsdbExpectedRevision {
  if (expected === 'any' || expected === 'no_stream' || expected === 'stream_exists') return expected;
  if (typeof expected !== 'number' || !Number.isSafeInteger(expected) || expected < 0) throw new TypeError(`invalid expected version ${String(expected)}`);
  return expected === 0 ? 'no_stream' : BigInt(expected - 1);
}

/** A revision (0-based) as a version (1-based). */
export function versionOf(revision: bigint): number {
  if (revision < -1n || revision >= maxSafe) throw new RangeError(`stream revision ${revision} is out of range`);
  return Number(revision) + 1;
}

/** ESDB's current revision of a stream, from a WrongExpectedVersion, as our version: `no_stream` is 0. */
export function actualVersionOf(current: 'no_stream' | bigint): number {
  return current === 'no_stream' ? 0 : versionOf(current);
}

/**
 * ESDB's own events in `$all` (stream metadata, projections' links and checkpoints, statistics): their
 * type or their stream starts with `$`. The log is everything else.
 */
export function isSystemEvent(type: string, streamId: string): boolean {
  return type.startsWith('$') || streamId.startsWith('$');
}

/** The server-side filter on event types: exactly these types (a .NET regex; each name escaped). */
export function eventTypesRegex(types: readonly string[]): string {
  return `^(?:${types.map((t) => t.replace(/[\\^$.|?*+()[\]{}]/g, '\\$&')).join('|')})$`;
}

const uuidPattern = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * What the SQL adapters refuse before an append is queued, refused the same way here, and what ESDB
 * would take for its own: a stream id or event type starting with `$` (system streams and events,
 * which `$all` readers here pass over). A value JSON cannot hold fails when the event is serialised.
 */
export function validateAppend(streamId: string, events: readonly NewEvent[], expected: ExpectedVersion): void {
  if (typeof streamId !== 'string' || streamId.length === 0) throw new TypeError('append: stream id must be a non-empty string');
  if (!storableText(streamId)) throw new InvalidEvent(streamId, 'stream_id');
  if (streamId.startsWith('$')) throw new TypeError(`append to ${streamId}: a stream id starting with $ is an EventStoreDB system stream`);
  if (!Array.isArray(events) || events.length === 0) throw new TypeError(`append to ${streamId}: at least one event is needed`);
  if (typeof expected === 'number' ? !Number.isSafeInteger(expected) || expected < 0 : !['any', 'no_stream', 'stream_exists'].includes(expected)) {
    throw new TypeError(`append to ${streamId}: invalid expected version ${String(expected)}`);
  }
  const ids = new Set<string>();
  for (const event of events) {
    if (typeof event.id !== 'string' || !uuidPattern.test(event.id)) throw new TypeError(`append to ${streamId}: event id must be a UUID`);
    if (ids.has(event.id.toLowerCase())) throw new TypeError(`append to ${streamId}: event id ${event.id} appears twice`);
    ids.add(event.id.toLowerCase());
    if (typeof event.type !== 'string' || event.type.length === 0) throw new TypeError(`append to ${streamId}: event type must be a non-empty string`);
    if (!storableText(event.type)) throw new InvalidEvent(streamId, 'event_type');
    if (event.type.startsWith('$')) throw new TypeError(`append to ${streamId}: an event type starting with $ is an EventStoreDB system event`);
    const metadata: unknown = event.metadata;
    if (metadata != null && (typeof metadata !== 'object' || Array.isArray(metadata))) throw new TypeError(`append to ${streamId}: event metadata must be an object`);
  }
}
