/**
 * The event store of a running gateway, read through its SQL port (sql-port.ts): what the CLI's
 * read-only commands open while the gateway holds the embedded store's data directory.
 */
import pg from 'pg';
import type { DriverTransaction, SqlDriver } from './driver.ts';

export async function createSqlPortDriver(port: number, password: string, host = '127.0.0.1'): Promise<SqlDriver> {
  const client = new pg.Client({ host, port, user: 'svc', database: 'svc', password, connectionTimeoutMillis: 5_000 });
  await client.connect();
  const query = ((sql: string, params?: unknown[]) => client.query(sql, params)) as SqlDriver['query'];
  const queryPrepared = ((_name: string, sql: string, params: unknown[]) => client.query(sql, params)) as SqlDriver['queryPrepared'];
  const tx: DriverTransaction = {
    query,
    queryPrepared,
    // Scripts are migrations, and the gateway that owns the store has applied them: nothing to run, and
    // the port would refuse it. (A migration the gateway lacks still fails: recording it is an INSERT.)
    exec: async () => {},
  };
  return {
    kind: 'pglite',
    hint() {},
    maxInFlight: 1,
    query,
    queryPrepared,
    async transaction(fn) {
      await client.query('BEGIN');
      try {
        const result = await fn(tx);
        await client.query('COMMIT');
        return result;
      } catch (error) {
        await client.query('ROLLBACK').catch(() => {});
        throw error;
      }
    },
    async listen() {},
    close: () => client.end(),
  };
}
