/**
 * What the meter projections share: reading a meter stream's id, and the per-stream guard that makes
 * each of them idempotent.
 */
import type { Queryable } from '../src/event-sourcing/index.ts';

export interface MeterDay {
  keyId: string;
  /** The stream's UTC day, `yyyy-mm-dd`. */
  day: string;
  /** Its month, `yyyy-mm`. */
  month: string;
}

const meterStreamPattern = /^meter-(.+)-(\d{4}-\d{2}-\d{2})$/;

/** Recently read stream ids (every projection reads each event's, and a key's day has many events). */
const recentDays = new Map<string, Readonly<MeterDay>>();

/** `meter-<keyId>-<yyyy-mm-dd>` -> key id, day, month; a meter event elsewhere is a bug worth stopping for. */
export function meterDayOf(streamId: string): Readonly<MeterDay> {
  const known = recentDays.get(streamId);
  if (known) return known;
  const match = meterStreamPattern.exec(streamId);
  if (!match) throw new Error(`meter event on stream "${streamId}", which is not meter-<keyId>-<yyyy-mm-dd>`);
  const found = { keyId: match[1], day: match[2], month: match[2].slice(0, 7) };
  if (recentDays.size >= 10_000) recentDays.clear();
  recentDays.set(streamId, found);
  return found;
}

/**
 * The guard table of a projection: the highest stream version applied per stream. The global log
 * hands a stream's events over in version order, so "apply an event only when its version is above
 * the stream's guard" applies each event exactly once, however often a batch or the whole log is
 * replayed. One row per meter stream (a key's day), not one per request.
 */
export async function createStreamGuard(db: Queryable, table: string): Promise<void> {
  await db.query(`CREATE TABLE IF NOT EXISTS ${table} (stream_id text COLLATE "C" PRIMARY KEY, stream_version bigint NOT NULL)`);
}

/**
 * A CTE named `fresh` that yields one row when the event (stream `$1`, version `$2`) was not applied
 * yet, and records it. Every write of the statement must read from `fresh` so that a replay writes nothing.
 */
export function freshCte(table: string): string {
  return `fresh AS (
    INSERT INTO ${table} AS g (stream_id, stream_version) VALUES ($1, $2::bigint)
    ON CONFLICT (stream_id) DO UPDATE SET stream_version = excluded.stream_version WHERE g.stream_version < excluded.stream_version
    RETURNING 1 AS applied)`;
}

/**
 * For a projection applied a batch at a time (`defineBatchProjection`): a CTE named `fresh` holding
 * the batch's events (`$1`, a JSON array of rows with `columns`, among them `stream_id text` and
 * `version bigint`) that the guard has not seen. Every statement of the batch reads `fresh` against
 * the guard as it was before the batch (`applied`, the stream's version there, null for a new stream);
 * `advanceGuard`, sent last, then records the batch.
 */
export function freshBatch(table: string, columns: string): string {
  return `fresh AS (
    SELECT e.*, g.stream_version AS applied FROM jsonb_to_recordset($1::jsonb) AS e(${columns})
    LEFT JOIN ${table} g ON g.stream_id = e.stream_id
    WHERE g.stream_version IS NULL OR g.stream_version < e.version)`;
}

/** The last statement of a batch: each stream's guard moves to the batch's highest version of it. */
export function advanceGuard(table: string): string {
  return `INSERT INTO ${table} AS g (stream_id, stream_version)
    SELECT e.stream_id, max(e.version) FROM jsonb_to_recordset($1::jsonb) AS e(stream_id text, version bigint) GROUP BY e.stream_id
    ON CONFLICT (stream_id) DO UPDATE SET stream_version = excluded.stream_version WHERE g.stream_version < excluded.stream_version`;
}

/**
 * What a batch does to a request's own rows (a hold, its facts), by its net effect. On a meter stream a
 * request id's events alternate: a reservation, then its settlement or expiry, then perhaps (a client
 * reusing its X-Request-Id) another reservation... (the meter decider refuses a second hold under an id
 * while one is open, and closes only a hold it has). So of a request's events in one batch, only two
 * touch its rows: a close whose reservation came before the batch (it removes the row) and a
 * reservation that no close follows in the batch (it adds one), in that order. A reservation closed
 * within the batch leaves the rows as they were, so it writes none: at a steady load, nearly every
 * request, where one event at a time would add a row and delete it again.
 *
 * `pairWithinBatch` finds the pairs in one pass, for the batch's JSON: a reservation's `closed` (a
 * close of it follows in the batch) and a close's `paired` (its reservation's stream version, when
 * that is in the batch). The SQL conditions below read them against the guard, so that a replayed
 * batch whose reservation was applied before still closes the hold it made.
 */
export interface BatchPairing {
  /** A reservation: a close of it follows in the batch. */
  closed: boolean;
  /** A settlement or expiry: the stream version of its reservation, when that is in the batch. */
  paired: number | null;
}

const closeTypes = new Set(['UsageSettled', 'ReservationExpired']);

export function pairWithinBatch(events: readonly { type: string; streamId: string; streamVersion: number; data: unknown }[]): BatchPairing[] {
  const pairing = events.map((): BatchPairing => ({ closed: false, paired: null }));
  const open = new Map<string, number>(); // stream + request id -> index of its reservation in the batch
  events.forEach((e, i) => {
    if (e.type !== 'BudgetReserved' && !closeTypes.has(e.type)) return;
    const request = `${e.streamId} ${(e.data as { request_id: string }).request_id}`;
    if (e.type === 'BudgetReserved') return void open.set(request, i);
    const reserved = open.get(request);
    if (reserved === undefined) return;
    open.delete(request);
    pairing[reserved].closed = true;
    pairing[i].paired = events[reserved].streamVersion;
  });
  return pairing;
}

/** The batch's `fresh` row under `alias` is a reservation still open at the batch's end: it adds its rows. */
export const outlivesBatch = (alias: string) => `${alias}.type = 'BudgetReserved' AND NOT ${alias}.closed`;

/** The batch's `fresh` row under `alias` closes a hold made before the batch (or applied before it): it removes its rows. */
export const closesEarlierHold = (alias: string) =>
  `${alias}.type IN ('UsageSettled', 'ReservationExpired') AND (${alias}.paired IS NULL OR ${alias}.paired <= coalesce(${alias}.applied, 0))`;
