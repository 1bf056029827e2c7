/**
 * Reading the global log over SQL: the columns an event is read with, the rule that a reader sees only
 * rows whose transaction is older than every running one, and the prepared reads subscriptions repeat.
 */
import { decodeEscaped, isEscaped } from './event-encoding.ts';
import type { RecordedEvent } from './types.ts';

/**
 * When an event was stored, as epoch milliseconds: a number the driver hands over as is, where a
 * timestamptz column is parsed by the driver's date parser into a Date (a regular expression per event,
 * about 14 µs of a metered request's CPU in the projections' reads; BENCHMARKS.md, gateway).
 */
const recordedMs = `(extract(epoch FROM recorded_at) * 1000)::float8 AS recorded_ms`;

// `tx`, not `transaction_id`: an output column named like the input one would make ORDER BY sort the text.
const columnsOf = (data: string, metadata: string) => `global_position, transaction_id::text AS tx, stream_id, stream_version,
  event_id::text AS event_id, event_type, ${data} AS data, ${metadata} AS metadata, ${recordedMs}`;
export const eventColumns = columnsOf('data', 'metadata');
/** Whether a subscriber passes an event over: its metadata holds $5 under the key $4. */
const skipped = `metadata->>$4 = $5`;
/** Or it is of none of the types $4 (and, with $5 and $6, skipped as above). */
const otherType = `NOT (event_type = ANY($4::text[]))`;
const otherTypeOrSkipped = `${otherType} OR metadata->>$5 = $6`;

/** Only rows whose transaction is older than every running one: nothing can commit before them later. */
export const visible = `transaction_id < pg_snapshot_xmin(pg_current_snapshot())`;

// Reads that subscriptions repeat many times a second go as prepared statements: parsed and planned
// once per connection, where each read cost PostgreSQL 0.29 ms of parsing and 0.28 of binding (a
// gateway's log, 976 reads in 20 s of sequential requests). Their plan is the same for any position.
export const readAllSql = `SELECT ${eventColumns} FROM events
  WHERE (transaction_id, global_position) > ($1::text::xid8, $2::bigint) AND ${visible}
  ORDER BY transaction_id, global_position LIMIT $3`;

/** A page for `readPage`: the events a subscriber passes over (`passed`) dropped but the last. */
const pageSql = (passed: string) => `SELECT ${columnsOf('CASE WHEN passed THEN NULL ELSE data END', 'CASE WHEN passed THEN NULL ELSE metadata END')}, scanned FROM (
    SELECT page.*, count(*) OVER () AS scanned, row_number() OVER (ORDER BY transaction_id, global_position) AS nth FROM (
      SELECT *, coalesce(${passed}, false) AS passed FROM events
      WHERE (transaction_id, global_position) > ($1::text::xid8, $2::bigint) AND ${visible}
      ORDER BY transaction_id, global_position LIMIT $3) AS page) AS counted
  WHERE NOT passed OR nth = scanned
  ORDER BY transaction_id, global_position`;
const readPageSkipping = { name: 'svc_read_page_skipping', sql: pageSql(skipped) };
const readPageOfTypes = { name: 'svc_read_page_of_types', sql: pageSql(otherType) };
const readPageOfTypesSkipping = { name: 'svc_read_page_of_types_skipping', sql: pageSql(otherTypeOrSkipped) };

export interface EventRow {
  global_position: string | number;
  tx: string;
  stream_id: string;
  stream_version: string | number;
  event_id: string;
  event_type: string;
  data: unknown;
  metadata: Record<string, unknown>;
  recorded_ms: number | string;
}

export function toEvent(row: EventRow): RecordedEvent {
  // An event stored escaped (a string jsonb refuses) is restored; the others are handed over as read.
  const { data, metadata } = isEscaped(row.metadata) ? decodeEscaped(row.data, row.metadata) : row;
  return {
    id: row.event_id,
    type: row.event_type,
    data,
    metadata,
    streamId: row.stream_id,
    streamVersion: Number(row.stream_version),
    globalPosition: { transactionId: Number(row.tx), position: Number(row.global_position) },
    recordedAt: new Date(Math.floor(Number(row.recorded_ms))),
  };
}

/**
 * How long a reader waits at most before reading again when commits exist that it cannot read yet (an
 * older transaction still runs, anywhere on the server): that transaction's end sends no hint.
 */
export const pendingRecheckMs = 40;

/** The prepared page `readPage` reads for a subscriber that skips by metadata (`skip`) and/or keeps only some types. */
export const pageStatement = (skip: boolean, types: boolean) => (types ? (skip ? readPageOfTypesSkipping : readPageOfTypes) : readPageSkipping);
