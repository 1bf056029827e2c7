/**
 * `svc sql-role NAME` on PostgreSQL: the role reads the analysts' tables (projections in the store's
 * schema) and `events`, and cannot write, create, or read the store's internal tables. Needs
 * DATABASE_URL (a role that may create databases and roles); skipped without it.
 */
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { promisify } from 'node:util';
import pg from 'pg';
import { svcCommand, packageRoot } from '../../src/config/index.ts';
import { openEventStore } from '../../src/store/index.ts';
import { ProjectionRunner } from '../../src/processors/index.ts';
import { projections } from '../../projections/index.ts';

const run = promisify(execFile);
const databaseUrl = process.env.DATABASE_URL;

if (!databaseUrl) {
  test('skipped: set DATABASE_URL to run svc sql-role (it creates a PostgreSQL role)', () => {});
} else {
  const suffix = randomBytes(4).toString('hex');
  const dbName = `svc_sqlrole_${suffix}`;
  const role = `analyst_${suffix}`;
  const admin = async (sql: string) => {
    const client = new pg.Client({ connectionString: databaseUrl });
    await client.connect();
    await client.query(sql).finally(() => client.end());
  };
  const dbUrl = new URL(databaseUrl);
  dbUrl.pathname = `/${dbName}`;

  test('svc sql-role: the role reads projection tables and events, and cannot write, create or read internal tables', async () => {
    await admin(`CREATE DATABASE ${dbName}`);
    const store = await openEventStore({ databaseUrl: dbUrl.toString() });
    try {
      const runner = new ProjectionRunner({ store, projections });
      await runner.start();
      await runner.caughtUp();
      await runner.stop();
    } finally {
      await store.close();
    }
    const env = { ...process.env, DATABASE_URL: dbUrl.toString() };
    const { stdout } = await run(process.execPath, [...svcCommand(), 'sql-role', role], { cwd: packageRoot, env });
    const url = /connection string \(the password is shown once\): (\S+)/.exec(stdout)?.[1];
    assert.ok(url, stdout);
    assert.match(stdout, /api_keys/);
    assert.match(stdout, /events/);

    const analyst = new pg.Client({ connectionString: url });
    await analyst.connect();
    const refused = async (sql: string) => {
      try {
        await analyst.query(sql);
        return null;
      } catch (error) {
        return (error as Error).message;
      }
    };
    try {
      assert.equal((await analyst.query('SELECT count(*)::int AS n FROM api_keys')).rows, [{ n: 0 }]);
      assert.ok((await analyst.query('SELECT count(*) FROM events')).rows.length === 1);
      assert.ok((await analyst.query('SELECT count(*) FROM key_usage')).rows.length === 1);
      for (const sql of [
        `INSERT INTO api_keys (key_id) VALUES ('x')`,
        'UPDATE events SET stream_id = stream_id',
        'DELETE FROM events',
        'CREATE TABLE mine (a int)',
        'CREATE TABLE public.mine (a int)',
        'BEGIN READ WRITE; INSERT INTO api_keys (key_id) VALUES (1); COMMIT',
      ]) {
        assert.ok(await refused(sql), `${sql} was allowed`);
        await analyst.query('ROLLBACK').catch(() => {});
      }
      for (const internal of ['projection_checkpoints', 'schema_migrations']) {
        assert.match((await refused(`SELECT * FROM ${internal}`)) ?? 'allowed', /does not exist/, `${internal} is not in the analysts' schema`);
      }
      const { rows: helpers } = await analyst.query<{ t: string }>(`SELECT format('%I.%I', schemaname, tablename) AS t FROM pg_tables WHERE schemaname LIKE '%\\_internal' ORDER BY 1`);
      for (const internal of ['public_internal.key_usage_holds', 'public_internal.projection_checkpoints', 'public_internal.schema_migrations']) {
        assert.ok(helpers.some((h) => h.t === internal), `${internal}: the store's own and the projections' helper tables are in <schema>_internal`);
      }
      for (const { t } of helpers) assert.match((await refused(`SELECT * FROM ${t}`)) ?? 'allowed', /permission denied/, t);
    } finally {
      await analyst.end();
    }
    // Run again: grants refreshed, the password kept.
    const again = await run(process.execPath, [...svcCommand(), 'sql-role', role], { cwd: packageRoot, env });
    assert.match(again.stdout, /password unchanged/);
  });

  test.after(async () => {
    await admin(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
    await admin(`DROP ROLE IF EXISTS ${role}`);
  });
}
test.run();
