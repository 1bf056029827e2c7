/**
 * The event store: one port (types.ts), two adapters over one SQL schema (infra/migrations).
 * PostgreSQL when a database URL is given, otherwise the embedded PGlite under the data directory.
 */
import { acquireDataDirLock } from './data-dir-lock.ts';
import { createPgliteDriver } from './pglite.ts';
import { createPostgresDriver } from './postgres.ts';
import { openSqlEventStore } from './sql-store.ts';
import type { EventStore } from './types.ts';

export * from './types.ts';
export { WrongExpectedVersion, DuplicateEventId, DataDirLocked, StoreClosed } from './errors.ts';
export { comparePositions, formatPosition } from './position.ts';

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
}

export async function openEventStore(options: OpenEventStoreOptions = {}): Promise<EventStore> {
  const storeOptions = { maxBatchEvents: options.maxBatchEvents, pollIntervalMs: options.pollIntervalMs };
  if (options.databaseUrl) {
    const driver = await createPostgresDriver({
      connectionString: options.databaseUrl,
      schema: options.schema,
      maxInFlight: options.maxInFlight,
      poolSize: options.poolSize,
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
    return openSqlEventStore(driver, storeOptions);
  }
  const dataDir = options.dataDir ?? './data';
  const lock = acquireDataDirLock(dataDir, options.purpose ?? `svc ${process.argv.slice(2).join(' ')}`.trim());
  try {
    const driver = await createPgliteDriver({ dataDir });
    try {
      return await openSqlEventStore(driver, { ...storeOptions, onClose: () => lock.release() });
    } catch (error) {
      await driver.close().catch(() => {});
      throw error;
    }
  } catch (error) {
    lock.release();
    throw error;
  }
}
