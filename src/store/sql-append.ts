/**
 * Appending over SQL: an append checked before it is queued, and a group commit's batch stored as one
 * plain INSERT (every append names its version) or through the append function (infra/migrations).
 */
import { AppendNotFirstWrite, DuplicateEventId, EventNotStorable, InvalidEvent, WrongExpectedVersion } from './errors.ts';
import { storableText } from './event-encoding.ts';
import type { PreparedQueryable } from './driver.ts';
import type { BatchOutcome, PendingAppend } from './group-commit.ts';
import type { ExpectedVersion, NewEvent } from './types.ts';

const uuidPattern = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

interface BatchRow {
  idx: number;
  outcome: 'ok' | 'idempotent' | 'conflict' | 'duplicate' | 'retry';
  version: string | number;
  last_position: string | number | null;
  last_tx: string | null;
}

/**
 * Refuses, before anything is queued, what would fail in the database: an append that reached a
 * group-commit batch and failed there would cost every other append of the batch a retry.
 */
export function validateAppend(streamId: string, events: readonly NewEvent[], expected: ExpectedVersion): void {
  if (typeof streamId !== 'string' || streamId.length === 0) throw new TypeError('append: stream id must be a non-empty string');
  if (!storableText(streamId)) throw new InvalidEvent(streamId, 'stream_id');
  if (!Array.isArray(events) || events.length === 0) throw new TypeError(`append to ${streamId}: at least one event is needed`);
  if (typeof expected === 'number' ? !Number.isSafeInteger(expected) || expected < 0 : !['any', 'no_stream', 'stream_exists'].includes(expected)) {
    throw new TypeError(`append to ${streamId}: invalid expected version ${String(expected)}`);
  }
  const ids = events.length > 1 ? new Set<string>() : null;
  for (const event of events) {
    if (typeof event.id !== 'string' || !uuidPattern.test(event.id)) throw new TypeError(`append to ${streamId}: event id must be a UUID`);
    if (ids) {
      if (ids.has(event.id.toLowerCase())) throw new TypeError(`append to ${streamId}: event id ${event.id} appears twice`);
      ids.add(event.id.toLowerCase());
    }
    if (typeof event.type !== 'string' || event.type.length === 0) throw new TypeError(`append to ${streamId}: event type must be a non-empty string`);
    if (!storableText(event.type)) throw new InvalidEvent(streamId, 'event_type');
    const metadata: unknown = event.metadata;
    if (metadata != null && (typeof metadata !== 'object' || Array.isArray(metadata))) throw new TypeError(`append to ${streamId}: event metadata must be an object`);
  }
}

const expectedCode = { any: -1, no_stream: -2, stream_exists: -3 } as const;

/** The append function's parameters: one array per column, so the database parses each event once. */
function batchParams(batch: readonly PendingAppend[]): unknown[] {
  const streams: string[] = [];
  const expected: number[] = [];
  const counts: number[] = [];
  const evAppend: number[] = [];
  const evOrd: number[] = [];
  const ids: string[] = [];
  const types: string[] = [];
  const data: string[] = [];
  const meta: string[] = [];
  batch.forEach((append, i) => {
    streams.push(append.streamId);
    expected.push(typeof append.expected === 'number' ? append.expected : expectedCode[append.expected]);
    counts.push(append.events.length);
    append.events.forEach((event, j) => {
      evAppend.push(i + 1);
      evOrd.push(j + 1);
      ids.push(event.id);
      types.push(event.type);
    });
    // serialized (and escaped where needed) once, when the append was made
    data.push(append.encoded.data);
    meta.push(append.encoded.metadata);
  });
  return [streams, expected, counts, evAppend, evOrd, ids, types, `[${data.join(',')}]`, `[${meta.join(',')}]`];
}

/** The plain INSERT's: the function's, with the version each append follows for its expected one, and no counts. */
function explicitParams(batch: readonly PendingAppend[], follows: readonly number[]): unknown[] {
  const params = batchParams(batch);
  return [params[0], follows, ...params.slice(3)];
}

function toOutcome(append: PendingAppend, row: BatchRow): BatchOutcome {
  const version = Number(row.version);
  switch (row.outcome) {
    case 'ok':
    case 'idempotent':
      return {
        ok: {
          nextExpectedVersion: version,
          lastPosition: { transactionId: Number(row.last_tx), position: Number(row.last_position) },
          idempotent: row.outcome === 'idempotent',
        },
      };
    case 'conflict':
      return { error: new WrongExpectedVersion(append.streamId, append.expected, version) };
    case 'duplicate':
      return { error: new DuplicateEventId(append.streamId, version) };
    case 'retry':
      return { retry: true };
    default:
      return { error: new Error(`append to ${append.streamId}: unexpected outcome ${String(row.outcome)}`) };
  }
}

/** untranslatable_character (`\u0000` in jsonb), character_not_in_repertoire (NUL in text), invalid_text_representation. */
const refusedValueCodes = new Set(['22P05', '22021', '22P02']);

const appendBatchSql = `SELECT idx, outcome, version, last_position, last_tx
  FROM svc_append_batch($1::text[], $2::bigint[], $3::int[], $4::int[], $5::int[], $6::uuid[], $7::text[], $8::jsonb, $9::jsonb)`;

/**
 * The common case as one plain INSERT: every append of the batch names the version it follows, so no
 * stream's version is read first and no function runs (here 0.37 ms a commit at p50 against the
 * function's 0.44-0.50, interleaved on one connection; a bare one-row INSERT takes 0.32). It keeps the
 * function's rules: the same per-stream locks, taken first and in the same order (the WHERE's
 * subquery runs once, before the first row), so it and the function never wait on each other in a
 * cycle and a stream's later versions belong to later transactions. The primary key (stream, version)
 * and the event-id index refuse what the function would sort out (another writer got there first, a
 * resend of stored events), and a named version that is not stored gives its rows no version, which
 * the table refuses: the statement is then undone whole and the batch goes to the function.
 */
// The arrays are read through subqueries so that no plan knows their length: the generic plan then
// costs what a custom one does and is kept, instead of planning the statement again at every call.
const appendExplicitSql = `INSERT INTO events (stream_id, stream_version, event_id, event_type, data, metadata)
  SELECT s.stream_id,
    CASE WHEN (SELECT bool_and(c.expected = 0 OR EXISTS (SELECT 1 FROM events e WHERE e.stream_id = c.stream_id AND e.stream_version = c.expected))
               FROM unnest((SELECT $1::text[]), (SELECT $2::bigint[])) AS c(stream_id, expected))
      THEN s.expected + ev.ord END,
    ev.event_id, ev.event_type, ev.data, ev.metadata
  FROM ROWS FROM (unnest($3::int[]), unnest($4::int[]), unnest($5::uuid[]), unnest($6::text[]),
                  jsonb_array_elements($7::jsonb), jsonb_array_elements($8::jsonb))
         AS ev(append_idx, ord, event_id, event_type, data, metadata)
  JOIN unnest((SELECT $1::text[]), (SELECT $2::bigint[])) WITH ORDINALITY AS s(stream_id, expected, idx) ON s.idx = ev.append_idx
  WHERE (SELECT count(*) FROM (
    SELECT pg_advisory_xact_lock(1937138433, l.k) FROM (SELECT DISTINCT hashtext(x) AS k FROM unnest((SELECT $1::text[])) AS x ORDER BY 1) AS l) AS locked) > 0
  ORDER BY ev.append_idx, ev.ord
  RETURNING stream_id, global_position, transaction_id::text AS tx`;

/**
 * The same for the commonest batches on the latency path, a few appends of one event each (a
 * sequential request's reservation, alone or with the previous request's settlement): plain parameters,
 * six per append, instead of arrays unnested and a JSON array taken apart. The same rules in the same
 * order: the streams' locks in lock-key order (an init plan, taken before any row is made), then each
 * named version's check, rows in call order. For one append of one event: 0.67-0.70 ms a commit at p50
 * against the array statement's 0.75-0.77, interleaved on one connection (a bare one-row INSERT:
 * 0.54-0.58); through the store, one append at a time, 0.64 against 0.70 back to back and 1.26-1.31
 * against 1.43-1.45 after 2 ms idle. For two: 0.68 against 0.72. At the gateway, sequential metered
 * requests alternated with a build that had the one-append case only: p50 3.293 against 3.361 ms and
 * 3.540 against 3.568.
 */
const appendValuesMax = 4;
/** By count: `appendValuesSql[n - 1]` stores n appends of one event each. */
const appendValuesSql = Array.from({ length: appendValuesMax }, (_, i) => i + 1).map((count) => {
  const rows = Array.from({ length: count }, (_, i) => {
    const p = (n: number) => `$${i * 6 + n}`;
    return `(${p(1)}::text, ${p(2)}::bigint, ${p(3)}::uuid, ${p(4)}::text, ${p(5)}::jsonb, ${p(6)}::jsonb, ${i + 1})`;
  });
  const streams = Array.from({ length: count }, (_, i) => `($${i * 6 + 1}::text)`);
  return `INSERT INTO events (stream_id, stream_version, event_id, event_type, data, metadata)
  SELECT v.stream_id,
    CASE WHEN v.follows = 0 OR EXISTS (SELECT 1 FROM events e WHERE e.stream_id = v.stream_id AND e.stream_version = v.follows) THEN v.follows + 1 END,
    v.event_id, v.event_type, v.data, v.metadata
  FROM (VALUES ${rows.join(', ')}) AS v(stream_id, follows, event_id, event_type, data, metadata, ord)
  WHERE (SELECT count(*) FROM (
    SELECT pg_advisory_xact_lock(1937138433, l.k) FROM (SELECT DISTINCT hashtext(s.id) AS k FROM (VALUES ${streams.join(', ')}) AS s(id) ORDER BY 1) AS l) AS locked) > 0
  ORDER BY v.ord
  RETURNING stream_id, global_position, transaction_id::text AS tx`;
});

/** What the plain INSERTs return, one row per event. */
type AppendedRow = { stream_id: string; global_position: string | number; tx: string };

/** unique_violation (a version or an event id taken), not_null_violation (a named version not stored). */
const explicitFallbackCodes = new Set(['23505', '23502']);

/**
 * Stores a batch: with `plainInsert` (a batch of its own, outside a transaction, on a connection that
 * keeps prepared statements), a batch whose appends all name their version goes as one plain INSERT
 * (`appendExplicitSql`); anything else, or what that refuses, through the append function.
 */
export async function runBatch(db: PreparedQueryable, batch: readonly PendingAppend[], plainInsert: boolean): Promise<BatchOutcome[]> {
  if (plainInsert && batch.every((append) => typeof append.expected === 'number' || append.expected === 'no_stream')) {
    try {
      const follows = batch.map((append) => (typeof append.expected === 'number' ? append.expected : 0));
      const plain = batch.length <= appendValuesMax && batch.every((append) => append.events.length === 1);
      const { rows } = plain
        ? await db.queryPrepared<AppendedRow>(
            `svc_append_values_${batch.length}`,
            appendValuesSql[batch.length - 1],
            batch.flatMap((append, i) => [append.streamId, follows[i], append.events[0].id, append.events[0].type, append.encoded.data, append.encoded.metadata]),
          )
        : await db.queryPrepared<AppendedRow>('svc_append_explicit', appendExplicitSql, explicitParams(batch, follows));
      const last = new Map<string, number>();
      for (const row of rows) last.set(row.stream_id, Math.max(last.get(row.stream_id) ?? 0, Number(row.global_position)));
      const transactionId = Number(rows[0].tx);
      return batch.map((append, i) => ({
        ok: {
          nextExpectedVersion: follows[i] + append.events.length,
          lastPosition: { transactionId, position: last.get(append.streamId)! },
          idempotent: false,
        },
      }));
    } catch (error) {
      if (!explicitFallbackCodes.has((error as { code?: string }).code ?? '')) throw storeError(error, batch);
    }
  }
  let rows: BatchRow[];
  try {
    // Prepared once per connection: the call is parsed and planned once, not per batch.
    ({ rows } = await db.queryPrepared<BatchRow>('svc_append_batch', appendBatchSql, batchParams(batch)));
  } catch (error) {
    throw storeError(error, batch);
  }
  return batch.map((append, i) => toOutcome(append, rows[i]));
}

/** A failed append's error, typed where the database said why. */
function storeError(error: unknown, batch: readonly PendingAppend[]): unknown {
  const code = (error as { code?: string }).code;
  if (code === 'SVA01' || code === 'SVA02') return new AppendNotFirstWrite(batch[0].streamId, code === 'SVA01' ? 'wrote_first' : 'newer_writer');
  // A value the database's types refuse: typed, and (retried alone by the group commit) failing only its own append.
  if (code !== undefined && refusedValueCodes.has(code)) return new EventNotStorable(batch.length === 1 ? batch[0].streamId : '(batch)', code, { cause: error });
  return error;
}
