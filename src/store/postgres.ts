/** PostgreSQL adapter (`pg`): a pool for appends and reads, one extra connection that LISTENs for commit hints. */
import pg from 'pg';
import type { DriverTransaction, SqlDriver } from './driver.ts';
import { StoreUnavailable, TransactionRolledBack } from './errors.ts';

export interface PostgresDriverOptions {
  connectionString: string;
  /** Schema holding the store's tables (created if missing); tests use one schema each. */
  schema?: string;
  /** Append batches in flight at once. */
  maxInFlight?: number;
  /** Connections in the pool (appends, reads and transactions share it). */
  poolSize?: number;
  /** Opening a connection, waiting for a pooled one included (default 5,000 ms). */
  connectTimeoutMs?: number;
  /** One statement: the server cancels it, and the client gives up on an answer, after this (default 10,000 ms; 0: none). */
  statementTimeoutMs?: number;
  /** The server ends a session left idle inside a transaction (a client that died holding locks) (default 60,000 ms). */
  idleInTransactionTimeoutMs?: number;
  /** TCP keepalive: first probe after this much silence (default 10,000 ms). */
  keepAliveMs?: number;
}

export const postgresDefaults = {
  connectTimeoutMs: 5_000,
  statementTimeoutMs: 10_000,
  idleInTransactionTimeoutMs: 60_000,
  keepAliveMs: 10_000,
} as const;

function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

const lostConnectionCodes = new Set(['ECONNRESET', 'EPIPE', 'ETIMEDOUT', 'EHOSTUNREACH', 'ENETUNREACH', '57P01', '57P02']);
const notConnectedCodes = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', '57P03']);

/**
 * A broken or silent connection, as a typed error; null for anything else (a SQL error, a conflict).
 * `outcomeUnknown`: the statement may have reached the server and committed.
 */
export function connectionFailure(error: unknown): StoreUnavailable | null {
  if (error instanceof StoreUnavailable) return error;
  const e = error as { code?: string; message?: string } | null;
  const code = e?.code ?? '';
  const message = e?.message ?? '';
  const unavailable = (what: string, outcomeUnknown: boolean) =>
    new StoreUnavailable(`the event store's database ${what}${outcomeUnknown ? '; the outcome of the last statement is unknown' : ''}: ${message}`, outcomeUnknown, { cause: error });
  if (notConnectedCodes.has(code) || /timeout exceeded when trying to connect|due to connection timeout/i.test(message)) return unavailable('cannot be reached', false);
  if (code === '57014') return unavailable('cancelled a statement that ran too long', false);
  if (code === '25P03') return unavailable('ended a transaction left idle too long', false);
  if (code.startsWith('08') || lostConnectionCodes.has(code) || /Query read timeout|Connection terminated|not queryable/i.test(message)) {
    return unavailable('connection broke or stopped answering', true);
  }
  return null;
}

function rethrow(error: unknown): never {
  throw connectionFailure(error) ?? error;
}

/** Closes a connection without waiting for the server's goodbye, which a black-holed one never sends. */
function destroy(client: pg.ClientBase): void {
  (client as unknown as { connection?: { stream?: { destroy(): void } } }).connection?.stream?.destroy();
}

export async function createPostgresDriver(options: PostgresDriverOptions): Promise<SqlDriver> {
  const schema = options.schema;
  const maxInFlight = options.maxInFlight ?? 2;
  const connectTimeoutMs = options.connectTimeoutMs ?? postgresDefaults.connectTimeoutMs;
  const statementTimeoutMs = options.statementTimeoutMs ?? postgresDefaults.statementTimeoutMs;
  const keepAliveMs = options.keepAliveMs ?? postgresDefaults.keepAliveMs;
  // Startup options outrank the role's and the database's defaults: the store's SQL is written for
  // READ COMMITTED (the append function re-reads after a unique violation).
  const startup = [`-c default_transaction_isolation=read\\ committed`, ...(schema ? [`-c search_path=${quoteIdent(schema)}`] : [])];
  const config: pg.ClientConfig = {
    connectionString: options.connectionString,
    options: startup.join(' '),
    connectionTimeoutMillis: connectTimeoutMs,
    // The server cancels a statement that runs too long; the client stops waiting for one that never
    // answers (a black-holed connection) a little later, and the pool then discards that connection.
    // (0: no statement timeout, for operators' long commands such as a projection rebuild)
    ...(statementTimeoutMs > 0 ? { statement_timeout: statementTimeoutMs, query_timeout: statementTimeoutMs + 1_000 } : {}),
    idle_in_transaction_session_timeout: options.idleInTransactionTimeoutMs ?? postgresDefaults.idleInTransactionTimeoutMs,
    keepAlive: true,
    keepAliveInitialDelayMillis: keepAliveMs,
  };
  if (schema) {
    const setup = new pg.Client({ ...config, options: undefined });
    await setup.connect().catch(rethrow);
    try {
      await setup.query(`CREATE SCHEMA IF NOT EXISTS ${quoteIdent(schema)}`).catch(rethrow);
    } finally {
      await setup.end().catch(() => {});
    }
  }
  const pool = new pg.Pool({ ...config, max: options.poolSize ?? maxInFlight + 4 });
  // An idle client's network error must not crash the process; the next query reconnects.
  pool.on('error', () => {});
  // This process's own NOTIFYs come back on its LISTEN connection: known by the sender's backend pid.
  const ownBackends = new Set<number>();
  pool.on('connect', (client) => {
    // A connection that drops while checked out emits 'error' besides failing its query: without a
    // listener that would crash the process. The query's own failure is what callers see.
    client.on('error', () => {});
    const pid = (client as unknown as { processID?: number }).processID;
    if (pid) ownBackends.add(pid);
  });
  pool.on('remove', (client) => ownBackends.delete((client as unknown as { processID: number }).processID));
  const channel = schema ? `svc_events_${schema}` : 'svc_events';

  let listener: pg.Client | null = null;
  let closed = false;
  let reconnectTimer: NodeJS.Timeout | undefined;
  let checkTimer: NodeJS.Timeout | undefined;
  // Every process's LISTEN connection carries this name, so a process can tell whether any other one
  // listens on this database: alone, it sends no hints at all (each one is a transaction of its own).
  // A process that starts listening says so with a hint of its own, and another process's hint proves
  // it listens: either makes this one hint again at once, without waiting for the next count.
  const listenerName = `svc listen ${channel}`.slice(0, 63);
  let othersListening = true;
  let foreignHintAt = 0;
  const countOthers = () => {
    if (closed) return;
    const askedAt = performance.now();
    pool
      .query<{ n: number }>(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = current_database() AND application_name = $1 AND pid <> $2`, [listenerName, (listener as unknown as { processID?: number } | null)?.processID ?? 0])
      .then(
        ({ rows }) => {
          if (foreignHintAt < askedAt) othersListening = rows[0].n > 0;
        },
        () => (othersListening = true),
      );
  };
  const othersTimer = setInterval(countOthers, 1000);
  othersTimer.unref();

  async function connectListener(onHint: () => void): Promise<void> {
    const client = new pg.Client({ ...config, application_name: listenerName });
    client.on('notification', (message) => {
      if (ownBackends.has(message.processId)) return;
      foreignHintAt = performance.now();
      othersListening = true;
      onHint();
    });
    const lost = () => {
      if (listener !== client) return;
      listener = null;
      clearInterval(checkTimer);
      destroy(client);
      client.end().catch(() => {});
      if (!closed) reconnectTimer = setTimeout(() => connectListener(onHint).catch(() => lost()), 1000);
    };
    client.on('error', lost);
    client.on('end', lost);
    listener = client;
    await client.connect();
    await client.query(`LISTEN ${quoteIdent(channel)}`);
    countOthers();
    // Awaited: the store opens once the others have been told (the NOTIFY reaches their LISTEN
    // connections as it commits). Sent and forgotten, it could still be on its way when one of them
    // commits, and that commit would go unhinted (it does not hint while it thinks itself alone).
    await announce();
    // A LISTEN connection only receives: a silent death shows only when it is asked something.
    clearInterval(checkTimer);
    let checking = false;
    checkTimer = setInterval(() => {
      if (checking) return lost(); // the last check is still unanswered (its own query_timeout is longer)
      checking = true;
      client.query('SELECT 1').then(() => (checking = false), lost);
    }, statementTimeoutMs || postgresDefaults.statementTimeoutMs);
    checkTimer.unref();
    onHint(); // anything committed while we were not listening is found by the re-read this causes
  }

  /** Runs on a pooled connection; a connection that broke or went silent is destroyed, not pooled again. */
  async function withClient<T>(work: (client: pg.PoolClient) => Promise<T>): Promise<T> {
    const client = await pool.connect().catch(rethrow);
    let result: T;
    try {
      result = await work(client);
    } catch (error) {
      const failure = connectionFailure(error);
      if (failure) destroy(client);
      client.release(failure ?? undefined);
      throw failure ?? error;
    }
    client.release();
    return result;
  }

  // At most one NOTIFY in flight per process; commits meanwhile are covered by one more after it.
  let hinting = false;
  let hintAgain = false;
  /** Tells the other processes this one listens (they may have stopped hinting, alone until now). */
  function announce(): Promise<void> {
    return pool.query(`SELECT pg_notify($1, '')`, [channel]).then(() => {}, () => {});
  }

  function hint(): void {
    if (closed || !othersListening) return;
    if (hinting) {
      hintAgain = true;
      return;
    }
    hinting = true;
    pool
      .query(`SELECT pg_notify($1, '')`, [channel])
      .catch(() => {}) // a lost hint only delays readers until their next poll
      .finally(() => {
        hinting = false;
        if (hintAgain) {
          hintAgain = false;
          hint();
        }
      });
  }

  return {
    kind: 'postgres',
    maxInFlight,
    hint,
    query: (sql, params) => withClient((client) => client.query(sql, params as unknown[]) as never),
    queryPrepared: (name, text, values) => withClient((client) => client.query({ name, text, values }) as never),
    async transaction(fn) {
      const client = await pool.connect().catch(rethrow);
      let broken = false;
      let rolledBack = false;
      let result: Awaited<ReturnType<typeof fn>>;
      try {
        await client.query('BEGIN ISOLATION LEVEL READ COMMITTED');
        const tx: DriverTransaction = {
          query: (sql, params) => (client.query(sql, params as unknown[]) as Promise<never>).catch(rethrow),
          queryPrepared: (name, text, values) => (client.query({ name, text, values }) as Promise<never>).catch(rethrow),
          exec: async (sql) => {
            await client.query(sql).catch(rethrow);
          },
        };
        result = await fn(tx);
        const commit = await client.query('COMMIT');
        // A statement failed and the callback went on: PostgreSQL answers COMMIT with a rollback, not an error.
        rolledBack = (commit as { command?: string }).command === 'ROLLBACK';
      } catch (error) {
        const failure = connectionFailure(error);
        if (failure) {
          // a ROLLBACK would wait on the same dead connection; the server rolls back when the session ends
          broken = true;
          destroy(client);
          throw failure;
        }
        await client.query('ROLLBACK').catch(() => {
          broken = true;
        });
        throw error;
      } finally {
        client.release(broken);
      }
      if (rolledBack) throw new TransactionRolledBack();
      return result;
    },
    async listen(onHint) {
      await connectListener(onHint);
    },
    async close() {
      closed = true;
      clearTimeout(reconnectTimer);
      clearInterval(checkTimer);
      clearInterval(othersTimer);
      const client = listener;
      listener = null;
      await client?.end().catch(() => {});
      await pool.end();
    },
  };
}
