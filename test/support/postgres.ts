/** PostgreSQL for tests and benches: why a server cannot be used, and scratch databases beside it. */
import { randomBytes } from 'node:crypto';
import pg from 'pg';

/** Null when the server at `url` answers; else why not (unset, unreachable), for a test's skip reason. */
export async function postgresUnavailable(url: string | null | undefined): Promise<string | null> {
  if (!url) return 'DATABASE_URL is not set';
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 3000 });
  try {
    await client.connect();
    await client.query('SELECT 1');
    return null;
  } catch (error) {
    return `PostgreSQL at DATABASE_URL cannot be reached (${(error as Error).message})`;
  } finally {
    await client.end().catch(() => {});
  }
}

/**
 * A fresh database next to the one `url` names (created with that connection, dropped by `drop`), so
 * a gateway under test or benchmark starts on an empty store and runs never collide.
 */
export async function scratchDatabase(url: string, label: string): Promise<{ url: string; drop(): Promise<void> }> {
  const name = `svc_${label}_${randomBytes(4).toString('hex')}`;
  const admin = async (sql: string) => {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    try {
      await client.query(sql);
    } finally {
      await client.end();
    }
  };
  await admin(`CREATE DATABASE "${name}"`);
  const scratch = new URL(url);
  scratch.pathname = `/${name}`;
  return { url: scratch.toString(), drop: () => admin(`DROP DATABASE IF EXISTS "${name}" WITH (FORCE)`) };
}
