/** PostgreSQL adapter (`pg`): a pool for appends and reads, one extra connection that LISTENs for commit hints. */
import pg from 'pg';
import type { DriverTransaction, SqlDriver } from './driver.ts';

export interface PostgresDriverOptions {
  connectionString: string;
  /** Schema holding the store's tables (created if missing); tests use one schema each. */
  schema?: string;
  /** Append batches in flight at once. */
  maxInFlight?: number;
  /** Connections in the pool (appends, reads and transactions share it). */
  poolSize?: number;
}

function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

export async function createPostgresDriver(options: PostgresDriverOptions): Promise<SqlDriver> {
  const schema = options.schema;
  const maxInFlight = options.maxInFlight ?? 2;
  const config: pg.ClientConfig = {
    connectionString: options.connectionString,
    ...(schema ? { options: `-c search_path=${quoteIdent(schema)}` } : {}),
  };
  if (schema) {
    const setup = new pg.Client({ connectionString: options.connectionString });
    await setup.connect();
    try {
      await setup.query(`CREATE SCHEMA IF NOT EXISTS ${quoteIdent(schema)}`);
    } finally {
      await setup.end();
    }
  }
  const pool = new pg.Pool({ ...config, max: options.poolSize ?? maxInFlight + 4 });
  // An idle client's network error must not crash the process; the next query reconnects.
  pool.on('error', () => {});
  const channel = schema ? `svc_events_${schema}` : 'svc_events';

  let listener: pg.Client | null = null;
  let closed = false;
  let reconnectTimer: NodeJS.Timeout | undefined;

  async function connectListener(onHint: () => void): Promise<void> {
    const client = new pg.Client(config);
    client.on('notification', () => onHint());
    const lost = () => {
      if (listener !== client) return;
      listener = null;
      client.end().catch(() => {});
      if (!closed) reconnectTimer = setTimeout(() => connectListener(onHint).catch(() => lost()), 1000);
    };
    client.on('error', lost);
    client.on('end', lost);
    listener = client;
    await client.connect();
    await client.query(`LISTEN ${quoteIdent(channel)}`);
    onHint(); // anything committed while we were not listening is found by the re-read this causes
  }

  return {
    kind: 'postgres',
    notifyChannel: channel,
    maxInFlight,
    query: (sql, params) => pool.query(sql, params as unknown[]) as never,
    queryPrepared: (name, text, values) => pool.query({ name, text, values }) as never,
    async transaction(fn) {
      const client = await pool.connect();
      let broken = false;
      try {
        await client.query('BEGIN');
        const tx: DriverTransaction = {
          query: (sql, params) => client.query(sql, params as unknown[]) as never,
          queryPrepared: (name, text, values) => client.query({ name, text, values }) as never,
          exec: async (sql) => {
            await client.query(sql);
          },
        };
        const result = await fn(tx);
        await client.query('COMMIT');
        return result;
      } catch (error) {
        await client.query('ROLLBACK').catch(() => {
          broken = true;
        });
        throw error;
      } finally {
        client.release(broken);
      }
    },
    async listen(onHint) {
      await connectListener(onHint);
    },
    async close() {
      closed = true;
      clearTimeout(reconnectTimer);
      const client = listener;
      listener = null;
      await client?.end().catch(() => {});
      await pool.end();
    },
  };
}
