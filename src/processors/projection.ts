import type { Queryable, RecordedEvent } from '../store/index.ts';

/**
 * A read model: its SQL tables and how events change them. `apply` runs inside the runner's
 * transaction, together with the checkpoint update, and must be idempotent (an upsert, an insert
 * that ignores rows it already has) so that replaying the same events changes nothing.
 */
export interface Projection {
  /** Stable name: the checkpoint's key and the CLI's argument. */
  name: string;
  /**
   * Tables this projection owns (unqualified names); a rebuild builds them afresh in a scratch schema and
   * swaps the rows in. Its helper tables (guards, pending rows: what analysts never query) are among
   * them but live in the schema's internal schema (`internalSchemaOf`), where a rebuild's copies do too.
   */
  tables: readonly string[];
  /** Creates the tables if missing. */
  init(db: Queryable): Promise<void>;
  /** Event types it reads; others only move its checkpoint. Omitted: every event. */
  eventTypes?: readonly string[];
  /** Applies events (in global order, already filtered by eventTypes). */
  apply(events: readonly RecordedEvent[], db: Queryable): Promise<void>;
}

/**
 * The SQL expression naming the internal schema of the schema `schema` (an SQL text expression):
 * `<schema>_internal`. A projection's helper tables live there, out of the analysts' schema, beside the
 * store's own tables; while a rebuild runs, its scratch schema's internal schema holds their copies.
 */
export { internalSchemaOf } from '../store/index.ts';
