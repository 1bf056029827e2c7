/**
 * The store for the CLI's read-only commands. While a gateway holds the embedded store's data directory,
 * they read through its SQL port instead of refusing; without a port they say, in one line, how to get one.
 * The log is the store's, or EventStoreDB's when SVC_EVENT_LOG=eventstoredb (opened beside it).
 */
import { resolveSqlPasswords, type Settings } from '../config/index.ts';
import { DataDirLocked, openStoreThroughSqlPort, readDataDirLock, type EventLog, type EventStore } from '../store/index.ts';
import { openConfiguredEventLog } from '../gateway/event-log.ts';

/** The port of the gateway holding the embedded store, null when nothing holds it (or on PostgreSQL); throws when a holder serves none. */
export function runningSqlPort(settings: Settings, command: string): number | null {
  if (settings.databaseUrl) return null;
  const holder = readDataDirLock(settings.dataDir);
  if (!holder) return null;
  if (holder.sqlPort !== null) return holder.sqlPort;
  throw new DataDirLocked(
    settings.dataDir,
    holder.pid,
    `the embedded store in ${settings.dataDir} is in use by another process (pid ${holder.pid}, ${holder.purpose}, since ${holder.since}), which serves no SQL port: ` +
      `to run \`svc ${command}\` while it runs, start it with \`svc serve --sql-port N\` (or stop it first)`,
  );
}

/** The running gateway's SQL port password for its owner (user `svc`), kept in DATA_DIR. */
export function sqlPortPassword(settings: Settings): string {
  return resolveSqlPasswords(process.env, settings.dataDir, false)?.owner ?? '';
}

/** Runs `use` with the configured event log: `store` itself, or EventStoreDB's, opened for it and closed after. */
export async function withEventLog<T>(settings: Settings, store: EventStore, use: (log: EventLog) => Promise<T>): Promise<T> {
  const esdb = await openConfiguredEventLog(settings);
  if (!esdb) return use(store);
  try {
    return await use(esdb);
  } finally {
    await esdb.close();
  }
}

/**
 * Runs `read` on the running gateway's store through its SQL port (and the configured log); null when
 * no gateway holds the store (open it as usual then).
 */
export async function readThroughRunningGateway(settings: Settings, command: string, read: (store: EventStore, log: EventLog) => Promise<number>): Promise<number | null> {
  const port = runningSqlPort(settings, command);
  if (port === null) return null;
  const store = await openStoreThroughSqlPort(port, sqlPortPassword(settings));
  try {
    return await withEventLog(settings, store, (log) => read(store, log));
  } finally {
    await store.close();
  }
}
