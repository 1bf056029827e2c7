/**
 * The event store: two ports (types.ts), the event log and the SQL database where processors keep
 * their rows, and two adapters that are both over one SQL schema (infra/migrations): PostgreSQL when
 * a database URL is given, otherwise the embedded PGlite under the data directory. Processors and the
 * command handler depend on the ports, not on the log being SQL.
 */
import { randomUUID } from 'node:crypto';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { acquireDataDirLock, type DataDirLock } from './data-dir-lock.ts';
import { createPgliteDriver, type PgliteDriver } from './pglite.ts';
import { serveSqlPort, type SqlPort, type SqlPortOptions } from './sql-port.ts';
import { createSqlPortDriver } from './sql-port-client.ts';
import { createPostgresDriver } from './postgres.ts';
import { openSqlEventStore } from './sql-store.ts';
import type { EventStore } from './types.ts';

export * from './types.ts';
export {
  WrongExpectedVersion,
  DuplicateEventId,
  DataDirLocked,
  StoreClosed,
  StoreUnavailable,
  AppendNotFirstWrite,
  StoreCallInsideTransaction,
  TransactionRolledBack,
  InvalidEvent,
  EventNotStorable,
} from './errors.ts';
export { comparePositions, formatPosition } from './position.ts';
export { toStorableText } from './event-encoding.ts';
export { internalSchemaOf, internalTable } from './internal-schema.ts';
export { readDataDirLock } from './data-dir-lock.ts';
export type { SqlPort, SqlPortOptions } from './sql-port.ts';
export { openEventStoreDbLog, type EventStoreDbLog, type OpenEventStoreDbLogOptions } from './eventstoredb.ts';

/** Embedded stores opened by this process: their PGlite and data-directory lock, for the SQL port. */
const embedded = new WeakMap<EventStore, { driver: PgliteDriver; lock: DataDirLock | null }>();

/**
 * Serves an embedded store read-only over the PostgreSQL wire protocol (sql-port.ts), and writes the
 * port into the data directory's lock so that the CLI's read-only commands find it. Close it before the store.
 */
export async function serveReadOnlySql(store: EventStore, options: SqlPortOptions & Partial<SqlPortLimits>): Promise<SqlPort> {
  const opened = embedded.get(store);
  if (!opened) throw new Error('the SQL port serves the embedded store only; with PostgreSQL, give analysts a read-only role (svc sql-role NAME)');
  const { driver } = opened;
  const limits = {
    statementTimeoutMs: options.statementTimeoutMs ?? envMs('SVC_SQL_STATEMENT_TIMEOUT_MS') ?? 5_000,
    memoryBytes: (options.memoryMb ?? envMs('SVC_SQL_MEMORY_MB') ?? 512) * 1024 * 1024,
    maxAgeMs: options.snapshotMaxAgeMs ?? envMs('SVC_SQL_SNAPSHOT_MAX_AGE_MS') ?? 5_000,
  };
  if (limits.statementTimeoutMs < 1) throw new Error('SVC_SQL_STATEMENT_TIMEOUT_MS must be at least 1');
  if (limits.memoryBytes < 256 * 1024 * 1024) throw new Error('SVC_SQL_MEMORY_MB must be at least 256 (PGlite alone takes about 200 MB)');
  // Snapshots beside the store's files (private like them); an in-memory store's in a private temporary directory.
  const snapshotsDir = driver.directory !== null ? join(dirname(driver.directory), 'sql-snapshots') : join(tmpdir(), `svc-sql-snapshots-${process.pid}-${randomUUID()}`);
  const port = await serveSqlPort({ database: driver.database, directory: driver.directory }, { ...options, snapshotsDir, limits });
  opened.lock?.advertise({ sqlPort: port.port });
  return port;
}

/** The SQL port's bounds; each defaults to its environment variable, then to the documented default. */
export interface SqlPortLimits {
  /** A statement is ended after this long (SVC_SQL_STATEMENT_TIMEOUT_MS, default 5,000). */
  statementTimeoutMs: number;
  /** The snapshot process's database memory, MiB (SVC_SQL_MEMORY_MB, default 512). */
  memoryMb: number;
  /** A statement reads a snapshot at most this old (SVC_SQL_SNAPSHOT_MAX_AGE_MS, default 5,000). */
  snapshotMaxAgeMs: number;
}

export interface OpenEventStoreOptions {
  /** PostgreSQL connection string; when set the Postgres adapter is used. */
  databaseUrl?: string | null;
  /** Embedded store directory (default ./data); the store takes an exclusive lock on it. */
  dataDir?: string;
  /** Embedded store kept in memory, no directory and no lock (tests). */
  inMemory?: boolean;
  /** Postgres schema for the store's tables (created if missing); default: the connection's search_path. */
  schema?: string;
  /** Who holds the data directory, shown to a second process that tries to open it. */
  purpose?: string;
  /** Postgres: append batches in flight at once (default 2: one per core of the reference machine). */
  maxInFlight?: number;
  /** Postgres: pool size (default maxInFlight + 4). */
  poolSize?: number;
  /** Largest group-commit batch in events (default 1000). */
  maxBatchEvents?: number;
  /** Live subscriptions' polling fallback in ms (default 1000). */
  pollIntervalMs?: number;
  /** Postgres: opening a connection, waiting for a pooled one included (default 5,000 ms; SVC_DB_CONNECT_TIMEOUT_MS). */
  connectTimeoutMs?: number;
  /** Postgres: one statement, server- and client-side (default 10,000 ms; 0: none; SVC_DB_STATEMENT_TIMEOUT_MS). */
  statementTimeoutMs?: number;
  /** Postgres: a session idle inside a transaction is ended (default 60,000 ms; SVC_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS). */
  idleInTransactionTimeoutMs?: number;
  /** Postgres: TCP keepalive's first probe after this much silence (default 10,000 ms). */
  keepAliveMs?: number;
  /** Postgres: send cross-process wake-up hints (default true; false only to measure what they cost). */
  notifyOtherProcesses?: boolean;
  /**
   * Postgres: at most one cross-process hint per this many ms (default 10): other processes' readers
   * hear of this one's commits up to that much later (they poll besides, every pollIntervalMs).
   */
  hintIntervalMs?: number;
  /** Told when a whole append batch fails (a broken connection, a deadlock). */
  onBatchError?: (error: unknown) => void;
  /**
   * Refuse the store's own methods called inside a `transaction` callback with StoreCallInsideTransaction
   * (default true). Telling them apart takes an AsyncLocalStorage around the callback, and on Node 20 that
   * puts promise hooks on every promise of the process: about 8 % of the metered gateway's CPU. So
   * `svc serve` turns it off; tests and the CLI's tools keep it, and catch such a call where it is written.
   */
  nestedCallCheck?: boolean;
  /** Told how long each group commit's batch took to store (ms), for /metrics. */
  onAppend?: (ms: number) => void;
}

/** A timeout from the environment (ms), or undefined when unset; a bad value stops the start, naming the variable. */
function envMs(name: string): number | undefined {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return undefined;
  const value = Number(raw);
  if (!Number.isSafeInteger(value) || value < 0) throw new Error(`environment variable ${name} must be a whole number of milliseconds, got ${JSON.stringify(raw)}`);
  return value;
}

/** A running gateway's embedded store, read through its SQL port: reads only (writes are refused there). */
export async function openStoreThroughSqlPort(port: number, password: string, options: Pick<OpenEventStoreOptions, 'pollIntervalMs'> = {}): Promise<EventStore> {
  const driver = await createSqlPortDriver(port, password);
  try {
    return await openSqlEventStore(driver, { pollIntervalMs: options.pollIntervalMs });
  } catch (error) {
    await driver.close().catch(() => {});
    throw error;
  }
}

export async function openEventStore(options: OpenEventStoreOptions = {}): Promise<EventStore> {
  const storeOptions = {
    maxBatchEvents: options.maxBatchEvents,
    pollIntervalMs: options.pollIntervalMs,
    notifyOtherProcesses: options.notifyOtherProcesses,
    hintIntervalMs: options.hintIntervalMs,
    onBatchError: options.onBatchError,
    nestedCallCheck: options.nestedCallCheck,
    onAppend: options.onAppend,
  };
  if (options.databaseUrl) {
    const driver = await createPostgresDriver({
      connectionString: options.databaseUrl,
      schema: options.schema,
      maxInFlight: options.maxInFlight,
      poolSize: options.poolSize,
      connectTimeoutMs: options.connectTimeoutMs ?? envMs('SVC_DB_CONNECT_TIMEOUT_MS'),
      statementTimeoutMs: options.statementTimeoutMs ?? envMs('SVC_DB_STATEMENT_TIMEOUT_MS'),
      idleInTransactionTimeoutMs: options.idleInTransactionTimeoutMs ?? envMs('SVC_DB_IDLE_IN_TRANSACTION_TIMEOUT_MS'),
      keepAliveMs: options.keepAliveMs,
    });
    try {
      return await openSqlEventStore(driver, storeOptions);
    } catch (error) {
      await driver.close().catch(() => {});
      throw error;
    }
  }
  if (options.inMemory) {
    const driver = await createPgliteDriver({ dataDir: null });
    const store = await openSqlEventStore(driver, storeOptions);
    embedded.set(store, { driver, lock: null });
    return store;
  }
  const dataDir = options.dataDir ?? './data';
  const lock = acquireDataDirLock(dataDir, options.purpose ?? `svc ${process.argv.slice(2).join(' ')}`.trim());
  try {
    const driver = await createPgliteDriver({ dataDir });
    try {
      const store = await openSqlEventStore(driver, { ...storeOptions, onClose: () => lock.release() });
      embedded.set(store, { driver, lock });
      return store;
    } catch (error) {
      await driver.close().catch(() => {});
      throw error;
    }
  } catch (error) {
    lock.release();
    throw error;
  }
}
