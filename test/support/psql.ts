/**
 * One statement through the SQL port as an analyst's client sends it: the real `psql` where it is
 * installed (with PostgreSQL, by infra/dev/services.sh), else the `pg` client, so that the port's rules
 * are still checked on a machine with no PostgreSQL. `ok` and the output (rows as psql -tA prints
 * them) or the error's text.
 */
import { execFile, spawnSync } from 'node:child_process';
import { promisify } from 'node:util';
import pg from 'pg';

const run = promisify(execFile);
export const havePsql = spawnSync('psql', ['--version'], { stdio: 'ignore' }).status === 0;

export interface SqlTarget {
  host: string;
  port: number;
  user: string;
  database: string;
}

export function targetOf(url: string): SqlTarget {
  const u = new URL(url);
  return { host: u.hostname, port: Number(u.port), user: decodeURIComponent(u.username), database: u.pathname.slice(1) };
}

export async function psqlStatement(target: SqlTarget, sql: string, password: string | null, env: NodeJS.ProcessEnv = process.env): Promise<{ ok: boolean; out: string }> {
  if (!havePsql) return viaPg(target, sql, password);
  const childEnv: NodeJS.ProcessEnv = { ...env, PGCONNECT_TIMEOUT: '5' };
  if (password === null) delete childEnv.PGPASSWORD;
  else childEnv.PGPASSWORD = password;
  const args = ['-X', '-w', '-h', target.host, '-p', String(target.port), '-U', target.user, '-d', target.database, '-v', 'ON_ERROR_STOP=1', '-tA', '-c', sql];
  try {
    const { stdout } = await run('psql', args, { env: childEnv });
    return { ok: true, out: stdout.trim() };
  } catch (error) {
    return { ok: false, out: (error as { stderr: string }).stderr.trim() };
  }
}

async function viaPg(target: SqlTarget, sql: string, password: string | null): Promise<{ ok: boolean; out: string }> {
  const client = new pg.Client({ ...target, password: password ?? undefined, connectionTimeoutMillis: 5_000 });
  try {
    await client.connect();
    const result = await client.query({ text: sql, rowMode: 'array' });
    return { ok: true, out: result.rows.map((row: unknown[]) => row.join('|')).join('\n') };
  } catch (error) {
    return { ok: false, out: String((error as Error).message) };
  } finally {
    await client.end().catch(() => undefined);
  }
}
