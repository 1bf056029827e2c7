/**
 * A projection's rebuild: the whole log replayed into fresh copies of its tables in a scratch schema,
 * then swapped in, in one transaction, with its checkpoint moved (see ProjectionRunner.rebuild).
 */
import type { CheckpointStore } from './checkpoints.ts';
import { internalSchemaOf, type Projection } from './projection.ts';
import type { EventLog, GlobalPosition, Queryable, RecordedEvent, SqlDatabase, StoreTransaction } from '../store/index.ts';

export interface RebuildProgress {
  name: string;
  done: number;
  total: number;
  elapsedMs: number;
}

export interface RebuildReport {
  name: string;
  events: number;
  seconds: number;
  eventsPerSecond: number;
}

function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

/** Puts the scratch schema first on this transaction's search_path: unqualified table names resolve there. */
async function useScratch(tx: Queryable, scratch: { schema: string; searchPath: string }): Promise<void> {
  await tx.query(`SELECT set_config('search_path', $1, true)`, [`${quoteIdent(scratch.schema)}, ${scratch.searchPath}`]);
}

/**
 * Where `table` is among `schemas` (the first that has it), qualified: a projection's table lives in
 * its schema, its helper tables in that schema's internal schema.
 */
async function locate(tx: Queryable, schemas: readonly string[], table: string): Promise<{ schema: string; qualified: string } | null> {
  const { rows } = await tx.query<{ schema: string; qualified: string }>(
    `SELECT n.nspname AS schema, format('%I.%I', n.nspname, c.relname) AS qualified
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.relname = $2 AND c.relkind IN ('r', 'p') AND n.nspname = ANY($1::text[])
     ORDER BY array_position($1::text[], n.nspname::text) LIMIT 1`,
    [schemas, table],
  );
  return rows[0] ?? null;
}

/** A schema and its internal schema (`internalSchemaOf`), as names. */
async function withInternal(tx: Queryable, schema: string): Promise<string[]> {
  const { rows } = await tx.query<{ internal: string }>(`SELECT ${internalSchemaOf('$1::text')} AS internal`, [schema]);
  return [schema, rows[0].internal];
}

/**
 * Replaces the rows of the live `table` by those of its rebuilt copy (each found in its schema or that
 * schema's internal schema). Same columns: the rows are
 * replaced in place (the table keeps its identity, so views, grants and indexes over it survive, and
 * MVCC readers see old or new rows, whole). Columns changed (the projection's definition did): the copy
 * replaces the table, which fails, rolling the swap back, if views still depend on the old one.
 */
async function swapTable(tx: Queryable, scratchSchemas: readonly string[], liveSchemas: readonly string[], table: string): Promise<void> {
  const columns = (relation: string) =>
    tx.query<{ c: string | null }>(
      `SELECT string_agg(quote_ident(attname) || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum) AS c
       FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`,
      [relation],
    );
  const [copy, live] = [await locate(tx, scratchSchemas, table), await locate(tx, liveSchemas, table)];
  if (!copy || !live) throw new Error(`rebuild: table ${table} has no ${copy ? 'live table' : 'rebuilt copy'} to swap`);
  const [liveColumns, rebuilt] = [(await columns(live.qualified)).rows[0].c, (await columns(copy.qualified)).rows[0].c];
  if (liveColumns === rebuilt) {
    await tx.query(`DELETE FROM ${live.qualified}`);
    await tx.query(`INSERT INTO ${live.qualified} SELECT * FROM ${copy.qualified}`);
    return;
  }
  await tx.query(`DROP TABLE ${live.qualified}`);
  await tx.query(`ALTER TABLE ${copy.qualified} SET SCHEMA ${quoteIdent(live.schema)}`);
}

/** What a rebuild reads and writes. */
export interface RebuildSources {
  readonly log: EventLog;
  readonly db: SqlDatabase;
  /** The log and the database are one SQL event store: the swap reads the log on its transaction's connection. */
  readonly sameStore: boolean;
  readonly checkpoints: CheckpointStore;
  /** Events per transaction (default 5,000). */
  readonly batchSize?: number;
}

/** Rebuilds `projection` (not applied live meanwhile: the caller sees to it). A failed rebuild leaves the live tables as they were. */
export async function rebuildProjection(sources: RebuildSources, projection: Projection, onProgress?: (progress: RebuildProgress) => void): Promise<RebuildReport> {
  const { log, db, checkpoints } = sources;
  const name = projection.name;
  const started = performance.now();
  let scratch: { schema: string; searchPath: string } | null = null;
  try {
    scratch = await db.transaction(async (tx) => {
      const { rows } = await tx.query<{ schema: string; search_path: string }>(
        `SELECT left(current_schema() || '_rebuild_' || $1::text, 63) AS schema, current_setting('search_path') AS search_path`,
        [name],
      );
      const found = { schema: rows[0].schema, searchPath: rows[0].search_path };
      for (const schema of await withInternal(tx, found.schema)) await tx.query(`DROP SCHEMA IF EXISTS ${quoteIdent(schema)} CASCADE`); // an interrupted rebuild's
      await tx.query(`CREATE SCHEMA ${quoteIdent(found.schema)}`);
      await useScratch(tx, found);
      await projection.init(tx);
      return found;
    });
    const inScratch = scratch;
    const wanted = projection.eventTypes ? new Set(projection.eventTypes) : null;
    const applyInScratch = async (tx: Queryable, batch: readonly RecordedEvent[]) => {
      const relevant = wanted ? batch.filter((e) => wanted.has(e.type)) : batch;
      if (relevant.length > 0) await projection.apply(relevant, tx);
    };
    const total = await log.countAfter(log.start);
    const batchSize = sources.batchSize ?? 5000;
    let position = log.start;
    let done = 0;
    // Batch by batch, each in its own transaction (one long transaction would hold back every reader
    // of the global log); the next batch is read while the current one is applied.
    let next = log.readAll(position, batchSize);
    for (;;) {
      const batch = await next;
      if (batch.length === 0) break;
      next = log.readAll(batch[batch.length - 1].globalPosition, batchSize);
      next.catch(() => {}); // awaited on the next turn; a failure there is reported then
      await db.transaction(async (tx) => {
        await useScratch(tx, inScratch);
        await applyInScratch(tx, batch);
      });
      position = batch[batch.length - 1].globalPosition;
      done += batch.length;
      onProgress?.({ name, done, total: Math.max(total, done), elapsedMs: performance.now() - started });
    }
    // The swap: with the checkpoint row locked (live runners of this projection wait), apply what
    // was committed since the last batch, copy the new rows over the live ones, move the checkpoint.
    await db.transaction(async (tx) => {
      await checkpoints.lock(tx, [name]);
      await useScratch(tx, inScratch);
      // The store's own reads refuse inside its transaction: the log is read on the transaction's connection then.
      const readAll = sources.sameStore ? (tx as StoreTransaction).readAll : (after: GlobalPosition, limit: number) => log.readAll(after, limit);
      for (;;) {
        const batch = await readAll(position, batchSize);
        if (batch.length === 0) break;
        await applyInScratch(tx, batch);
        position = batch[batch.length - 1].globalPosition;
        done += batch.length;
      }
      await tx.query(`SELECT set_config('search_path', $1, true)`, [inScratch.searchPath]);
      await projection.init(tx); // live tables that do not exist yet
      const scratchSchemas = await withInternal(tx, inScratch.schema);
      const { rows: home } = await tx.query<{ schema: string }>('SELECT current_schema() AS schema');
      const liveSchemas = await withInternal(tx, home[0].schema);
      for (const table of projection.tables) await swapTable(tx, scratchSchemas, liveSchemas, table);
      await checkpoints.set(tx, name, position);
      for (const schema of scratchSchemas) await tx.query(`DROP SCHEMA IF EXISTS ${quoteIdent(schema)} CASCADE`);
    });
    scratch = null;
    onProgress?.({ name, done, total: Math.max(total, done), elapsedMs: performance.now() - started });
    const seconds = (performance.now() - started) / 1000;
    return { name, events: done, seconds, eventsPerSecond: seconds > 0 ? done / seconds : 0 };
  } finally {
    // a failed rebuild leaves the live tables as they were; its scratch copies go
    if (scratch) {
      const schemas = await withInternal(db, scratch.schema).catch(() => [scratch!.schema]);
      for (const schema of schemas) await db.query(`DROP SCHEMA IF EXISTS ${quoteIdent(schema)} CASCADE`).catch(() => {});
    }
  }
}
