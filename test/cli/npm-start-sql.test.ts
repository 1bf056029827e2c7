/**
 * The analysts' and auditors' first hour: after the README's `npm start` (embedded store), a real `psql`
 * reads the tables read-only through the gateway's SQL port on the loopback, with the password printed
 * once beside the admin token and kept owner-only in DATA_DIR; `svc sql --url`, `svc sql` and `svc audit`
 * find the running gateway's port through the data directory and answer while it runs.
 */
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync, rmSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { freshDataDir } from '../support/data-dir.ts';
import { until } from '../support/until.ts';
import { psqlStatement, targetOf } from '../support/psql.ts';

const run = promisify(execFile);
const root = fileURLToPath(new URL('../..', import.meta.url));
const dataDir = await freshDataDir('svc-npm-start-sql-');

function env(): NodeJS.ProcessEnv {
  const e: NodeJS.ProcessEnv = { ...process.env, DATA_DIR: dataDir, PORT: '0', LOG_LEVEL: 'warn', npm_config_update_notifier: 'false' };
  for (const name of ['DATABASE_URL', 'SVC_ADMIN_TOKEN', 'SVC_SQL_PASSWORD', 'PGPASSWORD', 'PGUSER', 'PGDATABASE']) delete e[name];
  return e;
}

async function svc(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(process.execPath, [join(root, 'bin', 'svc.js'), ...args], { cwd: root, env: env() });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

function psql(target: string[], sql: string, password: string): Promise<{ ok: boolean; out: string }> {
  return psqlStatement(targetOf(target[0]), sql, password, env());
}

/** The addresses (hex, as /proc/net/tcp{,6} write them) on which something listens on `port`. */
function listeningAddresses(port: number): string[] {
  const addresses: string[] = [];
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text = '';
    try {
      text = readFileSync(file, 'utf8');
    } catch {
      continue; // no IPv6 here
    }
    for (const line of text.split('\n').slice(1)) {
      const [, local, , state] = line.trim().split(/\s+/);
      if (!local || state !== '0A') continue; // 0A: LISTEN
      const [address, hexPort] = local.split(':');
      if (parseInt(hexPort, 16) === port) addresses.push(address);
    }
  }
  return addresses;
}

let npm: ChildProcess | undefined;

test('after npm start, psql, svc sql and svc audit read the running gateway read-only through its loopback SQL port', async () => {
  npm = spawn('npm', ['start'], { cwd: root, env: env(), stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let output = '';
  npm.stdout!.on('data', (d) => (output += d));
  npm.stderr!.on('data', (d) => (output += d));
  const listening = await until('npm start listening', async () => {
    if (npm!.exitCode !== null) throw new Error(`npm start exited ${npm!.exitCode}: ${output}`);
    return /svc gateway listening on (\S+) and SQL \(read-only\) on 127\.0\.0\.1:(\d+)\n/.exec(output) ?? (/listening on/.test(output) ? ['', '', ''] : null);
  }, 300_000);
  assert.ok(listening[2], `npm start serves a SQL port:\n${output}`);
  const [, url, portText] = listening;
  const port = Number(portText);

  // The credentials: printed once, side by side, and kept owner-only in DATA_DIR.
  const adminToken = readFileSync(join(dataDir, 'admin-token'), 'utf8').trim();
  const password = readFileSync(join(dataDir, 'sql-password'), 'utf8').trim();
  for (const file of ['admin-token', 'sql-password', 'sql-owner-password']) assert.is(statSync(join(dataDir, file)).mode & 0o777, 0o600, file);
  const block = new RegExp(`\\nadmin token \\(shown once, stored in .*admin-token\\): ${adminToken}\\nSQL port password for analysts \\(shown once, stored in .*sql-password\\): ${password}\\n`);
  assert.match(output, block);
  assert.ok(output.includes(`analysts: psql "postgres://analyst@127.0.0.1:${port}/svc"`), output);

  // On the loopback only.
  const addresses = listeningAddresses(port);
  assert.ok(addresses.length > 0, `something listens on ${port}`);
  assert.equal([...new Set(addresses)], ['0100007F'], `the SQL port listens on 127.0.0.1 only: ${addresses.join(', ')}`);

  // psql by the URL `svc sql --url` prints, with the password from DATA_DIR.
  const printed = await svc(['sql', '--url']);
  assert.is(printed.code, 0, printed.stderr);
  assert.is(printed.stdout.trim(), `postgres://analyst@127.0.0.1:${port}/svc`);
  const target = [printed.stdout.trim()];
  assert.equal(await psql(target, 'SELECT 1', password), { ok: true, out: '1' });
  for (const wrong of ['wrong', '', adminToken]) {
    const refused = await psql(target, 'SELECT 1', wrong);
    assert.not.ok(refused.ok, `password ${JSON.stringify(wrong)} refused`);
    assert.match(refused.out, /password/);
  }

  const issued = await fetch(`${url}/admin/keys`, { method: 'POST', headers: { authorization: `Bearer ${adminToken}`, 'content-type': 'application/json' }, body: JSON.stringify({ email: 'auditor@example.com' }) });
  assert.is(issued.status, 201, await issued.clone().text());
  const { key, key_id: keyId } = (await issued.json()) as { key: string; key_id: string };
  const completion = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify({ model: 'ref-byte', prompt: 'Hello', max_tokens: 2 }) });
  assert.is(completion.status, 200, await completion.clone().text());
  const seen = await until('the projections to show the key and its request', async () => {
    const read = await psql(target, `SELECT count(*) FROM usage_ledger WHERE key_id = '${keyId}'`, password);
    return read.ok && read.out === '1' ? read : null;
  }, 60_000, 250);
  assert.ok(seen);

  // Writes are refused, through psql and through svc sql.
  for (const write of [`INSERT INTO api_keys (key_id) VALUES ('x')`, 'DELETE FROM events', 'CREATE TABLE mine (a int)']) {
    const refused = await psql(target, write, password);
    assert.not.ok(refused.ok, `${write} was refused`);
    assert.match(refused.out, /read-only|permission denied/, refused.out);
  }
  const sqlWrite = await svc(['sql', 'DELETE FROM api_keys']);
  assert.is(sqlWrite.code, 1);
  assert.match(sqlWrite.stderr, /read-only/);

  const sql = await svc(['sql', `SELECT key_id, status FROM api_keys WHERE key_id = '${keyId}'`, '--json']);
  assert.is(sql.code, 0, sql.stderr);
  assert.equal(JSON.parse(sql.stdout), { key_id: keyId, status: 'active' });

  const month = new Date().toISOString().slice(0, 7);
  const usage = await svc(['audit', 'usage', '--key', keyId, '--month', month]);
  assert.is(usage.code, 0, usage.stderr + usage.stdout);
  assert.match(usage.stdout, /agree: \d+ period\(s\), log and key_usage match/);
  const statement = await svc(['audit', 'statement', '--key', keyId, '--month', month, '--format', 'json']);
  assert.is(statement.code, 0, statement.stderr + statement.stdout);
  const parsed = JSON.parse(statement.stdout) as { agree: boolean; totals: { requests: number } };
  assert.is(parsed.agree, true);
  assert.is(parsed.totals.requests, 1);

  npm.kill('SIGTERM');
  await once(npm, 'exit');
  // With no gateway running there is no port to print, and the message says what to run.
  const none = await svc(['sql', '--url']);
  assert.is(none.code, 1);
  assert.match(none.stderr, /no gateway runs on .*: start one with `npm start`/);
});

test.after(() => {
  if (npm?.pid && npm.exitCode === null) {
    try {
      process.kill(-npm.pid, 'SIGKILL');
    } catch {
      // gone already
    }
  }
  rmSync(dataDir, { recursive: true, force: true });
});
test.run();
