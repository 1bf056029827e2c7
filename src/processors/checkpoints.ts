/**
 * Checkpoints of the log's processors (projections and workflows): where a processor has got to,
 * written in the same transaction of the SQL database as its rows. The checkpoint store is also the
 * processors' lock: locking a processor's checkpoint makes runners of it in other processes wait, then
 * find the checkpoint moved and go on from there. (Which process runs a processor at all is its lease,
 * `lease-store.ts`, checked in the same transaction.)
 */
import { internalTable, type EventLog, type EventStore, type GlobalPosition, type Queryable, type SqlDatabase } from '../store/index.ts';
import { sqlLeases, type LeaseStore } from './lease-store.ts';

export interface Checkpoint {
  position: GlobalPosition;
  updatedAt: Date;
}

/** Another runner (another process, a rebuild) moved the checkpoint: reload it and go on from there. */
export class CheckpointMoved extends Error {
  override name = 'CheckpointMoved';
}

/**
 * Where processors keep their checkpoints, in the SQL database. It stores positions of one kind of
 * log: the SQL one stores the SQL log's (transactionId, position) pair; another log needs a store
 * that knows its positions.
 */
export interface CheckpointStore {
  /** The checkpoints of these processors, by name (one without a checkpoint is missing). */
  read(db: Queryable, names: readonly string[]): Promise<Map<string, Checkpoint>>;
  /** The lock: reads these checkpoints and holds them (in name order) until `tx` ends. */
  lock(tx: Queryable, names: readonly string[]): Promise<Map<string, Checkpoint>>;
  /** Creates the processor's checkpoint at the log's start, unless it has one. */
  ensure(db: Queryable, name: string): Promise<void>;
  /** Moves these processors' checkpoints to `position` (locked by `tx` first). */
  move(tx: Queryable, names: readonly string[], position: GlobalPosition): Promise<void>;
  /** Sets a processor's checkpoint, creating it if needed (a rebuild's swap). */
  set(tx: Queryable, name: string, position: GlobalPosition): Promise<void>;
}

/**
 * The SQL log's checkpoints: one row per processor in `projection_checkpoints`, in the store's internal
 * schema (named qualified: a rebuild's scratch schema on the search_path never hides it); the lock is
 * the row's FOR UPDATE.
 */
export function sqlCheckpoints(db: Pick<SqlDatabase, 'internalSchema'>): CheckpointStore {
  const table = internalTable(db, 'projection_checkpoints');
  const read = async (db: Queryable, names: readonly string[], lock: boolean) => {
    const { rows } = await db.query<{ name: string; transaction_id: string; global_position: string | number; updated_at: Date | string }>(
      `SELECT name, transaction_id::text AS transaction_id, global_position, updated_at FROM ${table}
       WHERE name = ANY($1::text[])${lock ? ' ORDER BY name FOR UPDATE' : ''}`,
      [names],
    );
    return new Map(
      rows.map((r) => [r.name, { position: { transactionId: Number(r.transaction_id), position: Number(r.global_position) }, updatedAt: new Date(r.updated_at) }]),
    );
  };
  return {
    read: (db, names) => read(db, names, false),
    lock: (tx, names) => read(tx, names, true),
    async ensure(db, name) {
      await db.query(`INSERT INTO ${table} (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, [name]);
    },
    async move(tx, names, position) {
      await tx.query(
        `UPDATE ${table} SET transaction_id = $2::text::xid8, global_position = $3, updated_at = now() WHERE name = ANY($1::text[])`,
        [names, String(position.transactionId), position.position],
      );
    },
    async set(tx, name, position) {
      await tx.query(
        `INSERT INTO ${table} (name, transaction_id, global_position, updated_at) VALUES ($1, $2::text::xid8, $3, now())
         ON CONFLICT (name) DO UPDATE SET transaction_id = excluded.transaction_id, global_position = excluded.global_position, updated_at = now()`,
        [name, String(position.transactionId), position.position],
      );
    },
  };
}

/**
 * What a processor reads and writes: one SQL event store for both (its transactions then append and
 * read the log too), or a log and a SQL database apart. The checkpoints default to the SQL log's, the
 * leases to the SQL database's.
 */
export type ProcessorSources =
  | { store: EventStore; checkpoints?: CheckpointStore; leaseStore?: LeaseStore }
  | { log: EventLog; db: SqlDatabase; checkpoints?: CheckpointStore; leaseStore?: LeaseStore };

export interface ResolvedSources {
  log: EventLog;
  db: SqlDatabase;
  checkpoints: CheckpointStore;
  leases: LeaseStore;
  /** The log and the database when they are one store: its transactions can append and read the log. */
  store: EventStore | null;
}

export function resolveSources(sources: ProcessorSources): ResolvedSources {
  const db = 'store' in sources ? sources.store : sources.db;
  const checkpoints = sources.checkpoints ?? sqlCheckpoints(db);
  const leases = sources.leaseStore ?? sqlLeases(db);
  if ('store' in sources) return { log: sources.store, db: sources.store, checkpoints, leases, store: sources.store };
  const same = (sources.log as unknown) === sources.db ? (sources.db as EventStore) : null;
  return { log: sources.log, db: sources.db, checkpoints, leases, store: same };
}
