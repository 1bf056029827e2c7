/**
 * What the meter projections share: reading a meter stream's id, the position guard that makes each
 * of them idempotent, and the pairing of a batch's reservations with their closes.
 */
import type { Queryable } from '../src/event-sourcing/index.ts';
import { internalSchemaOf } from '../src/processors/index.ts';
import { meterStreamParts } from '../events/meter.ts';
import { monthOfDay } from '../events/shapes.ts';

export interface MeterDay {
  keyId: string;
  /** The stream's UTC day, `yyyy-mm-dd`. */
  day: string;
  /** Its month, `yyyy-mm`. */
  month: string;
}

/** Recently read stream ids (every projection reads each event's, and a key's day has many events). */
const recentDays = new Map<string, Readonly<MeterDay>>();

/** `meter-<keyId>-<yyyy-mm-dd>` -> key id, day, month; a meter event elsewhere is a bug worth stopping for. */
export function meterDayOf(streamId: string): Readonly<MeterDay> {
  const known = recentDays.get(streamId);
  if (known) return known;
  const parts = meterStreamParts(streamId);
  if (!parts) throw new Error(`meter event on stream "${streamId}", which is not meter-<keyId>-<yyyy-mm-dd>`);
  const found = { keyId: parts.keyId, day: parts.day, month: monthOfDay(parts.day) };
  if (recentDays.size >= 10_000) recentDays.clear();
  recentDays.set(streamId, found);
  return found;
}

/**
 * The guard table of a projection: the global position of the last event it applied, one row. The
 * runner hands events over in global order, so "apply an event only when it comes after the guard",
 * read in the same statement that applies it, applies each event exactly once however often a batch
 * or the whole log is replayed. One row per projection, moved once per batch (`advanceGuard`).
 *
 * (Until 2026-11-25 the guard was `<projection>_applied`, one row per meter stream, moved for every
 * key a batch touched: some 200 row updates per projection per batch at a steady load. That table is
 * dropped here.)
 */
export async function createPositionGuard(db: Queryable, projection: string): Promise<void> {
  await db.query(`DROP TABLE IF EXISTS ${projection}_applied`);
  await createInternalTable(db, guardTable(projection), 'one boolean PRIMARY KEY DEFAULT true CHECK (one), transaction_id bigint NOT NULL, global_position bigint NOT NULL');
}

/**
 * Creates a helper table (a guard, pending rows: nothing an analyst queries) in the internal schema of
 * the schema the projection's tables are created in (`<schema>_internal`, see `internalSchemaOf`), so
 * the analysts' schema holds only what they query. A table of an older release, found beside the
 * projection's tables, is moved there with its rows. In a rebuild that schema is the scratch one, so
 * the helper's copy is rebuilt with the tables. The projection's statements name it unqualified,
 * after `useInternalSchema`.
 */
export async function createInternalTable(db: Queryable, table: string, columns: string): Promise<void> {
  await db.query(`DO $do$ DECLARE
      home text := current_schema();
      internal text := ${internalSchemaOf('current_schema()')};
    BEGIN
      EXECUTE format('CREATE SCHEMA IF NOT EXISTS %I', internal);
      IF to_regclass(format('%I.%I', home, '${table}')) IS NOT NULL AND to_regclass(format('%I.%I', internal, '${table}')) IS NULL THEN
        EXECUTE format('ALTER TABLE %I.%I SET SCHEMA %I', home, '${table}', internal);
      END IF;
      EXECUTE format('CREATE TABLE IF NOT EXISTS %I.%I (%s)', internal, '${table}', $columns$${columns}$columns$);
    END $do$`);
}

/**
 * Puts the internal schema of the projection's schema right after it on this transaction's search_path
 * (once), so the helper tables resolve by their unqualified names: the live ones, or in a rebuild the
 * scratch copies (never a live helper table). The first statement of a batch that reads them.
 */
export function useInternalSchema(db: Queryable): Promise<unknown> {
  return db.query(
    `SELECT set_config('search_path', format('%I, %I, ', current_schema(), ${internalSchemaOf('current_schema()')}) || current_setting('search_path'), true)
     WHERE NOT ${internalSchemaOf('current_schema()')} = ANY (current_schemas(false))`,
  );
}

export const guardTable = (projection: string) => `${projection}_position`;

/** What the guard needs of a stored event: its place in the global log. */
type Placed = { globalPosition: { transactionId: number; position: number } };

/** An event's place in the global log, as the batch JSON carries it (`tx`, `gp`). */
export const logPlace = (e: Placed) => ({ tx: e.globalPosition.transactionId, gp: e.globalPosition.position });

/**
 * For a projection applied a batch at a time (`defineBatchProjection`): a CTE named `fresh` holding
 * the events of the statement's JSON (`$1`, an array of rows with `columns` and each event's
 * `logPlace`, see `rowsWhere`) that come after the guard. Every statement of the batch reads `fresh`
 * against the guard as it was before the batch; `advanceGuard`, sent last, moves it. The rows are read
 * as `json`, not `jsonb`: PostgreSQL reads 400 events' `json` in about half the time it takes to
 * build their `jsonb` (1.2 against 2.5 ms); that parse is most of a statement's cost, hence one JSON
 * per statement holding only the events it acts on.
 */
export function freshBatch(projection: string, columns: string): string {
  return `fresh AS (
    SELECT e.* FROM json_to_recordset($1::json) AS e(${columns}, tx bigint, gp bigint)
    WHERE NOT EXISTS (SELECT FROM ${guardTable(projection)} g WHERE (g.transaction_id, g.global_position) >= (e.tx, e.gp)))`;
}

/** The last statement of a batch: the guard moves to the batch's last event (never back). */
export function advanceGuard(db: Queryable, projection: string, events: readonly Placed[]): Promise<unknown> {
  const last = events[events.length - 1].globalPosition;
  return db.query(
    `INSERT INTO ${guardTable(projection)} AS g (transaction_id, global_position) VALUES ($1::bigint, $2::bigint)
     ON CONFLICT (one) DO UPDATE SET transaction_id = excluded.transaction_id, global_position = excluded.global_position
     WHERE (g.transaction_id, g.global_position) < (excluded.transaction_id, excluded.global_position)`,
    [last.transactionId, last.position],
  );
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
 * `pairWithinBatch` finds the pairs in one pass: a reservation's `closed` (a close of it follows in
 * the batch) and a close's `paired` (its reservation's index in the batch, when that is in the batch)
 * with that reservation's place in the log (`rtx`, `rgp`). So each statement is sent only the rows it
 * can act on (`rowsWhere`): a reservation closed within the batch is sent to none (a close of it,
 * whose reservation is fresh, removes nothing either), and the SQL conditions below read a close's
 * reservation place against the guard, so that a replayed batch whose reservation was applied before
 * still closes the hold it made.
 */
export interface BatchPairing {
  /** A reservation: a close of it follows in the batch. */
  closed: boolean;
  /** A settlement or expiry: its reservation's index in the batch, when it is there. */
  paired: number | null;
  /** A settlement or expiry whose reservation is in the batch: that reservation's place in the log (as `logPlace`). */
  rtx: number | null;
  rgp: number | null;
}

const closeTypes = new Set(['UsageSettled', 'ReservationExpired']);

export function pairWithinBatch(events: readonly (Placed & { type: string; streamId: string; data: unknown })[]): BatchPairing[] {
  const pairing = events.map((): BatchPairing => ({ closed: false, paired: null, rtx: null, rgp: null }));
  const open = new Map<string, number>(); // stream + request id -> index of its reservation in the batch
  events.forEach((e, i) => {
    if (e.type !== 'BudgetReserved' && !closeTypes.has(e.type)) return;
    const request = `${e.streamId} ${(e.data as { request_id: string }).request_id}`;
    if (e.type === 'BudgetReserved') return void open.set(request, i);
    const reserved = open.get(request);
    if (reserved === undefined) return;
    open.delete(request);
    pairing[reserved].closed = true;
    const place = events[reserved].globalPosition;
    Object.assign(pairing[i], { paired: reserved, rtx: place.transactionId, rgp: place.position });
  });
  return pairing;
}

/**
 * The rows of one statement's batch JSON: `row(event, index)` of each event `wanted` picks, in batch
 * order. A statement parses its whole JSON (`fresh`), so each is sent only the events it can act on.
 */
export function rowsWhere<E, Row>(events: readonly E[], wanted: (event: E, pos: number) => boolean, row: (event: E, pos: number) => Row): string {
  const rows: Row[] = [];
  for (let pos = 0; pos < events.length; pos++) if (wanted(events[pos], pos)) rows.push(row(events[pos], pos));
  return JSON.stringify(rows);
}

/** A reservation still open at the batch's end: it adds its rows (the statement's `fresh` then holds only those). */
export const outlivesBatch = (e: { type: string }, pairing: BatchPairing) => e.type === 'BudgetReserved' && !pairing.closed;

/** A settlement or expiry: it removes its reservation's rows if that came before the batch or before the guard (see below). */
export const isClose = (e: { type: string }) => closeTypes.has(e.type);

/**
 * The batch's `fresh` row under `alias`, a close (columns `type`, `rtx`, `rgp`), closes a hold made
 * before the batch, or in the batch but applied before (at or before the guard, `projection`'s): it
 * removes its rows. A close whose reservation is fresh removes nothing: that reservation added none.
 */
export const closesEarlierHold = (alias: string, projection: string) =>
  `${alias}.type IN ('UsageSettled', 'ReservationExpired') AND (${alias}.rtx IS NULL OR EXISTS (SELECT FROM ${guardTable(projection)} g WHERE (g.transaction_id, g.global_position) >= (${alias}.rtx, ${alias}.rgp)))`;
