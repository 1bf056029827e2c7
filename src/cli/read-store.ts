/**
 * The store for the CLI's read-only commands. While a gateway holds the embedded store's data directory,
 * they read through its SQL port instead of refusing; without a port they say, in one line, how to get one.
 * The log is the store's, or EventStoreDB's when SVC_EVENT_LOG=eventstoredb (opened beside it).
 */
import { hostname } from 'node:os';
import { resolveSqlPasswords, type Settings } from '../config/index.ts';
import { DataDirLocked, openStoreThroughSqlPort, readDataDirLock, type EventLog, type EventStore } from '../store/index.ts';
import { openConfiguredEventLog } from '../gateway/event-log.ts';

/** The port of the gateway holding the embedded store, null when nothing holds it (or on PostgreSQL); throws when a holder serves none. */
export function runningSqlPort(settings: Settings, command: string): number | null {
  if (settings.databaseUrl) return null;
  const holder = readDataDirLock(settings.dataDir);
  if (!holder) return null;
  const inUse = `the embedded store in ${settings.dataDir} is in use by another process (pid ${holder.pid}${holder.host === hostname() ? '' : ` on ${holder.host}`}, ${holder.purpose}, since ${holder.since})`;
  // A port on another host's loopback cannot be reached from here.
  if (holder.host !== hostname()) throw new DataDirLocked(settings.dataDir, holder.pid, `${inUse}: run \`svc ${command}\` on ${holder.host}, where it serves its SQL port`);
  if (holder.sqlPort !== null) return holder.sqlPort;
  throw new DataDirLocked(
    settings.dataDir,
    holder.pid,
    `${inUse}, which serves no SQL port: to run \`svc ${command}\` while it runs, stop it and start it again with \`npm start\` ` +
      '(it serves one) or `svc serve --sql-port 0`; or stop it and run the command again',
  );
}

/** The running gateway's SQL port as a connection URL for analysts (their password is in DATA_DIR/sql-password). */
export function analystUrl(port: number): string {
  return `postgres://analyst@127.0.0.1:${port}/svc`;
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
