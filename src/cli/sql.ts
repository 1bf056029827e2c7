/**
 * `svc sql "SELECT ..." [--json]`: one read-only query, for scripts. On the embedded store it goes
 * through the running gateway's SQL port, or, with no gateway running, through a port this command
 * serves for itself: the same checks either way. On PostgreSQL it runs in a READ ONLY transaction
 * that is rolled back.
 *
 * `svc sql-role NAME` (PostgreSQL): a login role that may read the analysts' tables (the projections'
 * tables in the store's schema, and `events`) and nothing else; prints its connection string once.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import type { Settings } from '../config/index.ts';
import { openEventStore, serveReadOnlySql } from '../store/index.ts';
import { projections } from '../../projections/index.ts';
import { analystUrl, runningSqlPort, sqlPortPassword } from './read-store.ts';

export const sqlUsage =
  'usage: svc sql "SELECT ..." [--json]      one read-only query (--json: one JSON object per row)\n' +
  '       svc sql --url                      the running gateway\'s SQL port as a URL for psql (user analyst; password in DATA_DIR/sql-password)\n';
export const sqlRoleUsage = 'usage: svc sql-role NAME                   PostgreSQL: a login role that reads the analysts\' tables and events only\n';

function cell(value: unknown): string {
  if (value === null || value === undefined) return '';
  if (value instanceof Date) return value.toISOString();
  return typeof value === 'object' ? JSON.stringify(value) : String(value);
}

function print(result: pg.QueryResult, json: boolean): void {
  if (json) {
    for (const row of result.rows) process.stdout.write(`${JSON.stringify(row)}\n`);
    return;
  }
  if (result.fields.length === 0) {
    process.stdout.write(`${result.command ?? ''}\n`);
    return;
  }
  const lines = [result.fields.map((f) => f.name), ...result.rows.map((row) => result.fields.map((f) => cell(row[f.name])))];
  const widths = lines[0].map((_, i) => Math.max(...lines.map((l) => l[i].length)));
  const [header, ...rows] = lines.map((l) => l.map((c, i) => c.padEnd(widths[i])).join(' | ').trimEnd());
  process.stdout.write(`${header}\n${widths.map((w) => '-'.repeat(w)).join('-+-')}\n${rows.map((r) => `${r}\n`).join('')}(${rows.length} row${rows.length === 1 ? '' : 's'})\n`);
}

/** One statement (the extended protocol takes no more), read-only. */
async function readOnly(client: pg.Client, sql: string): Promise<pg.QueryResult> {
  await client.query('BEGIN READ ONLY');
  try {
    return await client.query({ text: sql, queryMode: 'extended' } as pg.QueryConfig);
  } finally {
    await client.query('ROLLBACK').catch(() => {});
  }
}

async function onPort(port: number, password: string, sql: string): Promise<pg.QueryResult> {
  const client = new pg.Client({ host: '127.0.0.1', port, user: 'svc', database: 'svc', password });
  await client.connect();
  try {
    return await readOnly(client, sql);
  } finally {
    await client.end();
  }
}

export async function sqlCommand(args: string[], settings: Settings): Promise<number> {
  if (args.length === 1 && args[0] === '--url') return printUrl(settings);
  const json = args.includes('--json');
  const rest = args.filter((a) => a !== '--json');
  if (rest.length !== 1 || rest[0].startsWith('--')) {
    process.stderr.write(sqlUsage);
    return 2;
  }
  const sql = rest[0];
  let result: pg.QueryResult;
  try {
    if (settings.databaseUrl) {
      const client = new pg.Client({ connectionString: settings.databaseUrl });
      await client.connect();
      try {
        result = await readOnly(client, sql);
      } finally {
        await client.end();
      }
    } else {
      const port = runningSqlPort(settings, 'sql');
      if (port !== null) result = await onPort(port, sqlPortPassword(settings), sql);
      else {
        // No gateway runs: this command opens the store and serves itself a port, so the checks are the gateway's.
        const store = await openEventStore({ dataDir: settings.dataDir, purpose: 'svc sql' });
        try {
          const password = randomBytes(24).toString('base64url'); // this command's own port, for itself only
          const own = await serveReadOnlySql(store, { port: 0, passwords: { owner: password, analyst: randomBytes(24).toString('base64url') } });
          try {
            result = await onPort(own.port, password, sql);
          } finally {
            await own.close();
          }
        } finally {
          await store.close();
        }
      }
    }
  } catch (error) {
    if (error instanceof pg.DatabaseError) {
      process.stderr.write(`svc sql: ${error.message}\n`);
      return 1;
    }
    throw error;
  }
  print(result, json);
  return 0;
}

/** `svc sql --url`: where psql reaches the running gateway's SQL port (or, on PostgreSQL, what to use instead). */
function printUrl(settings: Settings): number {
  if (settings.databaseUrl) {
    process.stderr.write('svc sql --url: the store is PostgreSQL (DATABASE_URL): give analysts a read-only role with `svc sql-role NAME`, which prints their connection string\n');
    return 2;
  }
  const port = runningSqlPort(settings, 'sql --url');
  if (port === null) {
    process.stderr.write(`svc sql --url: no gateway runs on ${settings.dataDir}: start one with \`npm start\` (or \`svc serve --sql-port 0\`), then run this again\n`);
    return 1;
  }
  process.stdout.write(`${analystUrl(port)}\n`);
  return 0;
}

const quoteIdent = (name: string) => `"${name.replaceAll('"', '""')}"`;

export async function sqlRoleCommand(args: string[], settings: Settings): Promise<number> {
  const [name, ...extra] = args;
  if (!name || extra.length > 0 || !/^[a-z_][a-z0-9_]{0,62}$/.test(name)) {
    process.stderr.write(`${sqlRoleUsage}       NAME: lower-case letters, digits and _\n`);
    return 2;
  }
  if (!settings.databaseUrl) {
    process.stderr.write('svc sql-role: roles are for a PostgreSQL store (DATABASE_URL); on the embedded store, `npm start` serves a read-only SQL port: connect with psql "$(svc sql --url)" and the password in DATA_DIR/sql-password\n');
    return 2;
  }
  const client = new pg.Client({ connectionString: settings.databaseUrl });
  await client.connect();
  try {
    const { rows: [where] } = await client.query<{ schema: string; db: string }>('SELECT current_schema() AS schema, current_database() AS db');
    const wanted = ['events', ...new Set(projections.flatMap((p) => p.tables))];
    // Helper tables live in <schema>_internal: only the tables in the store's own schema are granted.
    const { rows: present } = await client.query<{ name: string }>(
      `SELECT c.relname AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
       WHERE n.nspname = $1 AND c.relkind IN ('r', 'v', 'm', 'p') AND c.relname = ANY($2) ORDER BY c.relname`,
      [where.schema, wanted],
    );
    const { rowCount: exists } = await client.query('SELECT 1 FROM pg_roles WHERE rolname = $1', [name]);
    const password = exists ? null : randomBytes(18).toString('base64url');
    const role = quoteIdent(name);
    const schema = quoteIdent(where.schema);
    await client.query('BEGIN');
    try {
      if (password) await client.query(`CREATE ROLE ${role} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD '${password}'`);
      await client.query(`ALTER ROLE ${role} SET default_transaction_read_only = on`);
      await client.query(`ALTER ROLE ${role} SET search_path = ${schema}`);
      await client.query(`GRANT CONNECT ON DATABASE ${quoteIdent(where.db)} TO ${role}`);
      await client.query(`GRANT USAGE ON SCHEMA ${schema} TO ${role}`);
      if (present.length > 0) await client.query(`GRANT SELECT ON ${present.map((t) => `${schema}.${quoteIdent(t.name)}`).join(', ')} TO ${role}`);
      await client.query('COMMIT');
    } catch (error) {
      await client.query('ROLLBACK').catch(() => {});
      throw error;
    }
    const { rows: [rights] } = await client.query<{ create: boolean }>('SELECT has_schema_privilege($1, $2, $3) AS create', [name, where.schema, 'CREATE']);
    process.stdout.write(`role ${name}: SELECT on ${present.map((t) => t.name).join(', ') || 'no table yet (start the gateway, then run this again)'} in schema ${where.schema}\n`);
    if (rights.create) process.stdout.write(`warning: everyone may create tables in schema ${where.schema} (PostgreSQL before 15); run: REVOKE CREATE ON SCHEMA ${schema} FROM PUBLIC\n`);
    if (password) {
      const url = new URL(settings.databaseUrl);
      url.username = name;
      url.password = password;
      url.search = '';
      process.stdout.write(`connection string (the password is shown once): ${url.toString()}\n`);
    } else process.stdout.write(`role ${name} existed: grants refreshed, password unchanged\n`);
    return 0;
  } finally {
    await client.end();
  }
}
