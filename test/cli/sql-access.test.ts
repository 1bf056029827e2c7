/**
 * Analysts' SQL access while the gateway runs, on the embedded store: a real `svc serve --sql-port 0`
 * process; `psql` reads a projection table through the port and its writes are refused; `svc audit
 * usage`, `svc events read`, `svc projections status` and `svc sql --json` answer through the port
 * instead of refusing; a gateway without a port makes them say how to get one.
 */
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { svcCommand, packageRoot } from '../../src/config/index.ts';
import { firstKeywords } from '../../src/store/sql-port.ts';
import { freshDataDir } from '../support/data-dir.ts';
import { psqlStatement } from '../support/psql.ts';

const run = promisify(execFile);
const adminToken = 'sql-access-test-admin-token';
// A copy of an empty embedded database: the first `svc serve` need not create one (seconds of CPU).
const dataDir = await freshDataDir('svc-sql-');

function env(): NodeJS.ProcessEnv {
  const e: NodeJS.ProcessEnv = { ...process.env, DATA_DIR: dataDir, PORT: '0', SVC_ADMIN_TOKEN: adminToken, LOG_LEVEL: 'warn' };
  delete e.DATABASE_URL;
  return e;
}

async function svc(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(process.execPath, [...svcCommand(), ...args], { cwd: packageRoot, env: env() });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

/** The port's password, as `svc serve` keeps it (printed once, on the start that made it). */
const sqlPassword = () => readFileSync(join(dataDir, 'sql-password'), 'utf8').trim();

function psql(port: number, sql: string, password: string | null = sqlPassword()): Promise<{ ok: boolean; out: string }> {
  return psqlStatement({ host: '127.0.0.1', port, user: 'analyst', database: 'svc' }, sql, password);
}

/** Starts `svc serve` and resolves once it prints its listening line. */
function serve(args: string[]): Promise<{ child: ChildProcess; url: string; sqlPort: number | null; stderr: () => string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [...svcCommand(), 'serve', ...args], { cwd: packageRoot, env: env(), stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr!.on('data', (d) => {
      stderr += d;
      const m = /svc gateway listening on (\S+?)(?: and SQL \(read-only\) on 127\.0\.0\.1:(\d+))?\n/.exec(stderr);
      if (m) resolve({ child, url: m[1], sqlPort: m[2] ? Number(m[2]) : null, stderr: () => stderr });
    });
    child.once('exit', (code) => reject(new Error(`svc serve exited (${code}): ${stderr}`)));
  });
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGTERM');
  await exited;
}

test('the statement check splits on semicolons outside strings, identifiers, dollar quotes and comments', () => {
  assert.equal(firstKeywords(`SELECT ';'; -- ; insert\n/* ; /* nested; */ */ (SELECT 1)`), ['select', 'select']);
  assert.equal(firstKeywords(`SELECT $x$;COMMIT;$x$, E'\\';commit', "a;b"; commit`), ['select', 'commit']);
  assert.equal(firstKeywords('  '), ['']);
  assert.equal(firstKeywords('WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d'), ['with']);
});

test('svc serve --sql-port: psql reads the tables while the gateway runs, writes are refused, read-only commands answer through it', async () => {
  const gateway = await serve(['--sql-port', '0']);
  try {
    assert.ok(gateway.sqlPort, 'the listening line names the SQL port');
    // The port needs its password: printed once, kept owner-only in DATA_DIR; none or a wrong one is refused.
    assert.match(gateway.stderr(), new RegExp(`SQL port password for analysts \\(shown once, stored in .*sql-password\\): ${sqlPassword()}`));
    assert.is(statSync(join(dataDir, 'sql-password')).mode & 0o777, 0o600);
    for (const password of [null, 'wrong', '']) {
      const refused = await psql(gateway.sqlPort!, 'SELECT 1', password);
      assert.not.ok(refused.ok, `password ${password}`);
      assert.match(refused.out, /password/, refused.out);
    }
    assert.equal(await psql(gateway.sqlPort!, 'SELECT 1'), { ok: true, out: '1' });
    const issued = await fetch(`${gateway.url}/admin/keys`, {
      method: 'POST',
      headers: { authorization: `Bearer ${adminToken}`, 'content-type': 'application/json' },
      body: JSON.stringify({ email: 'analyst@example.com' }),
    });
    assert.is(issued.status, 201, await issued.clone().text());
    const key = (await issued.json()) as { key_id?: string; prefix?: string; id?: string };
    const keyId = key.key_id ?? key.prefix ?? key.id;

    // The projection catches up on its own; the port reads what it wrote.
    let count = '';
    for (let i = 0; i < 100 && count !== '1'; i++) {
      const read = await psql(gateway.sqlPort!, 'SELECT count(*) FROM api_keys');
      assert.ok(read.ok, read.out);
      count = read.out;
      if (count !== '1') await new Promise((r) => setTimeout(r, 100));
    }
    assert.is(count, '1');

    for (const write of [
      `INSERT INTO api_keys (key_id) VALUES ('x')`,
      'DELETE FROM events',
      'WITH gone AS (DELETE FROM events RETURNING 1) SELECT count(*) FROM gone',
      'SELECT 1; COMMIT; DELETE FROM events',
      'SET default_transaction_read_only = off',
      'CREATE TABLE mine (a int)',
      'EXPLAIN ANALYZE DELETE FROM events',
    ]) {
      const refused = await psql(gateway.sqlPort!, write);
      assert.not.ok(refused.ok, `${write} was not refused`);
      // Refused by the port's check, or (a DELETE inside a WITH) by the read-only transaction or the
      // analysts' role, whichever comes first.
      assert.match(refused.out, /read-only|permission denied/, `${write}: ${refused.out}`);
    }
    // A session setting changed through the port does not leak into the gateway's session.
    await psql(gateway.sqlPort!, `SELECT set_config('search_path', 'nowhere', false)`);
    assert.is((await psql(gateway.sqlPort!, 'SHOW search_path')).out, 'analyst, pg_catalog');
    assert.is((await psql(gateway.sqlPort!, 'SELECT count(*) FROM api_keys')).out, '1');
    const events = await psql(gateway.sqlPort!, `SELECT count(*) FROM events WHERE event_type = 'KeyIssued'`);
    assert.is(events.out, '1');

    // Analysts read views without secrets or e-mail addresses: no email, secret_sha256 or client_ip, user_id
    // as user_ref, and none of those keys anywhere in the events' JSON; the tables themselves are refused.
    const columns = (await psql(gateway.sqlPort!, `SELECT string_agg(column_name, ',' ORDER BY ordinal_position) FROM information_schema.columns WHERE table_schema = 'analyst' AND table_name = 'api_keys'`)).out;
    assert.ok(columns.includes('key_id') && columns.includes('user_ref'), columns);
    assert.not.match(columns, /email|secret|user_id/);
    const issuedData = (await psql(gateway.sqlPort!, `SELECT data::text FROM events WHERE event_type = 'KeyIssued'`)).out;
    assert.ok(issuedData.includes('budgets') || issuedData.includes('key_id'), issuedData);
    assert.not.match(issuedData, /email|secret_sha256|analyst@example\.com|user_id/);
    const anyEmail = (await psql(gateway.sqlPort!, `SELECT count(*) FROM events WHERE data::text LIKE '%@example.com%' OR metadata::text LIKE '%@example.com%'`)).out;
    assert.is(anyEmail, '0');
    for (const denied of ['SELECT email FROM public.api_keys', 'SELECT data FROM public.events', `SELECT set_config('role', 'postgres', true), count(*) FROM public.api_keys`]) {
      const refused = await psql(gateway.sqlPort!, denied);
      assert.not.ok(refused.ok, denied);
      assert.match(refused.out, /permission denied/, `${denied}: ${refused.out}`);
    }
    // The analysts' password is not the owner's: user svc (every column, for the CLI) needs DATA_DIR's other password.
    const asOwner = (await psqlStatement({ host: '127.0.0.1', port: gateway.sqlPort!, user: 'svc', database: 'svc' }, 'SELECT 1', sqlPassword())).out;
    assert.match(asOwner, /password authentication failed/);
    assert.is(statSync(join(dataDir, 'sql-owner-password')).mode & 0o777, 0o600);

    // The gateway still serves and writes while analysts read.
    const again = await fetch(`${gateway.url}/admin/keys`, { method: 'POST', headers: { authorization: `Bearer ${adminToken}`, 'content-type': 'application/json' }, body: JSON.stringify({ email: 'b@example.com' }) });
    assert.is(again.status, 201);

    const sql = await svc(['sql', 'SELECT key_id, email FROM api_keys ORDER BY email', '--json']);
    assert.is(sql.code, 0, sql.stderr);
    const rows = sql.stdout.trim().split('\n').map((l) => JSON.parse(l));
    assert.ok(rows.some((r) => r.email === 'analyst@example.com'), sql.stdout);
    const sqlWrite = await svc(['sql', 'DELETE FROM api_keys']);
    assert.is(sqlWrite.code, 1);
    assert.match(sqlWrite.stderr, /read-only/);

    const stream = (await psql(gateway.sqlPort!, `SELECT stream_id FROM events WHERE event_type = 'KeyIssued' ORDER BY global_position LIMIT 1`)).out;
    const read = await svc(['events', 'read', stream, '--json']);
    assert.is(read.code, 0, read.stderr);
    assert.is(JSON.parse(read.stdout.trim().split('\n')[0]).type, 'KeyIssued');

    const status = await svc(['projections', 'status', '--json']);
    assert.is(status.code, 0, status.stderr);
    assert.ok((JSON.parse(status.stdout) as { name: string }[]).some((s) => s.name === 'api_keys'), status.stdout);

    const audit = await svc(['audit', 'usage', '--key', String(keyId), '--month', '2026-11']);
    assert.is(audit.code, 0, audit.stderr + audit.stdout);
    assert.match(audit.stdout, /agree|no usage/);
  } finally {
    await stop(gateway.child);
  }
});

test('without --sql-port the read-only commands say in one line how to run them while the gateway runs', async () => {
  const gateway = await serve([]);
  try {
    assert.is(gateway.sqlPort, null);
    const read = await svc(['events', 'read', 'anything']);
    assert.is(read.code, 1);
    assert.is(read.stderr.trim().split('\n').length, 1, read.stderr);
    assert.match(read.stderr, /stop it and start it again with `npm start` \(it serves one\) or `svc serve --sql-port 0`/);
  } finally {
    await stop(gateway.child);
  }
  // With no gateway running, `svc sql` opens the store itself, under the same checks.
  const sql = await svc(['sql', 'SELECT count(*) AS keys FROM api_keys', '--json']);
  assert.is(sql.code, 0, sql.stderr);
  assert.equal(JSON.parse(sql.stdout), { keys: '2' });
});

test.after(() => rmSync(dataDir, { recursive: true, force: true }));
test.run();
