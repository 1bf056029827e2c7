import type { Queryable, RecordedEvent } from '../store/index.ts';

/**
 * A read model: its SQL tables and how events change them. `apply` runs inside the runner's
 * transaction, together with the checkpoint update, and must be idempotent (an upsert, an insert
 * that ignores rows it already has) so that replaying the same events changes nothing.
 */
export interface Projection {
  /** Stable name: the checkpoint's key and the CLI's argument. */
  name: string;
  /** Tables this projection owns (unqualified names); a rebuild builds them afresh in a scratch schema and swaps the rows in. */
  tables: readonly string[];
  /** Creates the tables if missing. */
  init(db: Queryable): Promise<void>;
  /** Event types it reads; others only move its checkpoint. Omitted: every event. */
  eventTypes?: readonly string[];
  /** Applies events (in global order, already filtered by eventTypes). */
  apply(events: readonly RecordedEvent[], db: Queryable): Promise<void>;
}
