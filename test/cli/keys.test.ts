import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { loadSettings } from '../../src/config/index.ts';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';

// `svc keys ...` as an operator runs it: a child process talking to a real gateway over HTTP.
const cli = suite('svc keys against a running gateway');
const svc = fileURLToPath(new URL('../../bin/svc.js', import.meta.url));
let gw: TestGateway;
let dataDir: string;

cli.before(async () => {
  // No engine: nothing here calls one (engines start on a first completion, which never comes).
  gw = await startTestGateway({ engines: { ...loadSettings({}, { models: [] }).engines, warmAtStart: false } });
  // An operator's DATA_DIR holding the gateway's admin token: the default when SVC_ADMIN_TOKEN is unset.
  dataDir = mkdtempSync(join(tmpdir(), 'svc-cli-keys-'));
  writeFileSync(join(dataDir, 'admin-token'), `${gw.adminToken}\n`, { mode: 0o600 });
});
cli.after(async () => {
  await gw?.stop();
  rmSync(dataDir, { recursive: true, force: true });
});

function run(args: string[], env: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, [svc, 'keys', ...args], { env: { ...process.env, SVC_URL: gw.url, DATA_DIR: dataDir, SVC_ADMIN_TOKEN: '', DATABASE_URL: '', ...env }, timeout: 120_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? ((error as { code?: number }).code ?? 1) : 0, stdout, stderr });
    });
  });
}

cli('create, show, set-budget, pause, resume, revoke and list, as tables and as JSON', async () => {
  const created = await run(['create', '--email', 'ops@example.org', '--user-id', 'ops', '--monthly-token-budget', '5000', '--json']);
  assert.is(created.code, 0, created.stderr);
  const key = JSON.parse(created.stdout);
  assert.match(key.key, /^svc_[0-9a-f]{12}_/);
  assert.is(key.user_id, 'ops');
  assert.is(key.monthly_token_budget, 5000);
  const use = await fetch(`${gw.url}/v1/models`, { headers: { authorization: `Bearer ${key.key}` } });
  assert.is(use.status, 200, 'the key works');

  const table = await run(['create', '--email', 'table@example.org']);
  assert.is(table.code, 0, table.stderr);
  assert.match(table.stdout, /key \(shown once, store it now\): svc_[0-9a-f]{12}_\S{43}\n/);
  assert.match(table.stdout, /status\s+active/);

  const budget = await run(['set-budget', key.prefix, '--daily-token-budget', '300', '--monthly-token-budget', 'none'], { SVC_ADMIN_TOKEN: gw.adminToken });
  assert.is(budget.code, 0, budget.stderr);
  assert.match(budget.stdout, /daily_token_budget\s+300/);
  assert.match(budget.stdout, /monthly_token_budget\s+-/);

  const paused = await run(['pause', key.prefix, '--json']);
  assert.is(JSON.parse(paused.stdout).status, 'paused');
  assert.is((await fetch(`${gw.url}/v1/models`, { headers: { authorization: `Bearer ${key.key}` } })).status, 401);
  assert.is((await run(['resume', key.prefix])).code, 0);
  const revoked = await run(['revoke', key.prefix]);
  assert.match(revoked.stdout, /status\s+revoked/);

  const shown = await run(['show', key.prefix]);
  assert.is(shown.code, 0, shown.stderr);
  assert.match(shown.stdout, /email\s+ops@example\.org/);
  assert.match(shown.stdout, /usage \d{4}-\d{2}\s+0 tokens/);
  assert.not.ok(shown.stdout.includes(key.key), 'the key is never shown again');

  const list = await run(['list']);
  assert.is(list.code, 0, list.stderr);
  const lines = list.stdout.trimEnd().split('\n');
  assert.match(lines[0], /^PREFIX\s+STATUS\s+EMAIL\s+USER\s+MONTH\s+USED/);
  assert.ok(lines.some((l) => l.startsWith(key.prefix) && /\brevoked\b/.test(l) && l.includes('ops@example.org')), list.stdout);
  const listed = JSON.parse((await run(['list', '--json'])).stdout);
  assert.ok(Array.isArray(listed) && listed.some((k: any) => k.prefix === key.prefix && k.daily_token_budget === 300));
});

cli('clear errors: wrong token, server down, unknown prefix, bad arguments', async () => {
  // A port nobody listens on: take a free one and close it.
  const port = await new Promise<number>((resolve) => {
    const server = createServer().listen(0, '127.0.0.1', () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
  // Independent processes, run side by side.
  const [wrong, down, missing, noToken, usage, bare] = await Promise.all([
    run(['list'], { SVC_ADMIN_TOKEN: 'not-the-token' }),
    run(['list'], { SVC_URL: `http://127.0.0.1:${port}` }),
    run(['show', '0123456789ab']),
    run(['list'], { DATA_DIR: join(dataDir, 'elsewhere') }),
    run(['set-budget', '0123456789ab', '--daily-token-budget', '-3']),
    run(['create']),
  ]);
  assert.is(wrong.code, 1);
  assert.match(wrong.stderr, /401 invalid_api_key: invalid admin token \(the gateway at http:\/\/127\.0\.0\.1:\d+ refused the admin token/);

  assert.is(down.code, 1);
  assert.match(down.stderr, /cannot reach the gateway at http:\/\/127\.0\.0\.1:\d+ \(ECONNREFUSED\); is `svc serve` running\?/);

  assert.is(missing.code, 1);
  assert.match(missing.stderr, /404 not_found: no API key with prefix/);

  assert.is(noToken.code, 1);
  assert.match(noToken.stderr, /no admin token: set SVC_ADMIN_TOKEN/);

  assert.is(usage.code, 2);
  assert.match(usage.stderr, /--daily-token-budget must be a non-negative integer or "none"/);
  assert.is(bare.code, 2);
});

cli.run();
