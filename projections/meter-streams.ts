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

/** `meter-<keyId>-<yyyy-mm-dd>` -> key id, day, month; a meter event elsewhere is a bug worth stopping for. */
export function meterDayOf(streamId: string): MeterDay {
  const match = meterStreamPattern.exec(streamId);
  if (!match) throw new Error(`meter event on stream "${streamId}", which is not meter-<keyId>-<yyyy-mm-dd>`);
  return { keyId: match[1], day: match[2], month: match[2].slice(0, 7) };
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
 * the guard as it was before the batch; `advanceGuard`, sent last, then records the batch.
 */
export function freshBatch(table: string, columns: string): string {
  return `fresh AS (
    SELECT e.* FROM jsonb_to_recordset($1::jsonb) AS e(${columns})
    WHERE NOT EXISTS (SELECT 1 FROM ${table} g WHERE g.stream_id = e.stream_id AND g.stream_version >= e.version))`;
}

/** The last statement of a batch: each stream's guard moves to the batch's highest version of it. */
export function advanceGuard(table: string): string {
  return `INSERT INTO ${table} AS g (stream_id, stream_version)
    SELECT e.stream_id, max(e.version) FROM jsonb_to_recordset($1::jsonb) AS e(stream_id text, version bigint) GROUP BY e.stream_id
    ON CONFLICT (stream_id) DO UPDATE SET stream_version = excluded.stream_version WHERE g.stream_version < excluded.stream_version`;
}
