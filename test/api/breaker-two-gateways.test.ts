/**
 * One breaker shared by two gateway processes on one PostgreSQL: failures through gateway 1 open it,
 * gateway 2 sees it open (from the log, without a request of its own reaching the engine), and when the
 * cooldown ends only one of the two sends the half-open probe, counted at the engine (a real listener
 * that fails as told). PostgreSQL only: the embedded store belongs to one process.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { waitForLine } from '../support/gateway-cluster.ts';
import { issueKey } from '../support/gateway.ts';
import { startFailingEngine, staticModel, type FailingEngine } from '../support/failing-engine.ts';
import { until } from '../support/until.ts';

const it = suite('a breaker shared by two gateways');
const databaseUrl = process.env.DATABASE_URL;
const svc = fileURLToPath(new URL('../../bin/svc.js', import.meta.url));
const threshold = 3;

if (!databaseUrl) {
  it('skipped: two gateway processes need PostgreSQL (set DATABASE_URL)', () => {});
} else {
  const adminToken = `svc_admin_${randomBytes(12).toString('hex')}`;
  const dbName = `svc_breaker_${randomBytes(5).toString('hex')}`;
  const dir = mkdtempSync(join(tmpdir(), 'svc-breaker-'));
  const children: ChildProcess[] = [];
  const urls: string[] = [];
  let engine: FailingEngine;
  let key: string;
  const admin = async (sql: string) => {
    const client = new pg.Client({ connectionString: databaseUrl });
    await client.connect();
    await client.query(sql).finally(() => client.end());
  };

  it.before(async () => {
    engine = await startFailingEngine('ok');
    await admin(`CREATE DATABASE ${dbName}`);
    const dbUrl = new URL(databaseUrl);
    dbUrl.pathname = `/${dbName}`;
    const config = join(dir, 'models.json');
    writeFileSync(config, JSON.stringify({ models: [staticModel(engine.url)] }));
    // One at a time: the first runs the migrations alone.
    for (let i = 0; i < 2; i++) {
      const child = spawn(process.execPath, [svc, 'serve'], {
        env: {
          ...process.env,
          DATABASE_URL: dbUrl.toString(),
          SVC_CONFIG: config,
          PORT: '0',
          DATA_DIR: mkdtempSync(join(dir, 'gw-')),
          SVC_ADMIN_TOKEN: adminToken,
          SVC_BREAKER_FAILURE_THRESHOLD: String(threshold),
          SVC_BREAKER_COOLDOWN_MS: '2000',
          SVC_SHUTDOWN_GRACE_MS: '1000',
          LOG_LEVEL: 'warn',
        },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      children.push(child);
      child.stdout!.resume();
      const [, url] = await waitForLine(child, 'stderr', /listening on (http:\/\/\S+)/);
      child.stderr!.resume();
      urls.push(url);
    }
    key = await issueKey(urls[0], adminToken);
  });

  it.after(async () => {
    for (const child of children) child.kill('SIGTERM');
    await Promise.all(children.map((c) => (c.exitCode === null && c.signalCode === null ? new Promise((r) => c.once('exit', r)) : null)));
    await engine?.close();
    await admin(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
    rmSync(dir, { recursive: true, force: true });
  });

  const complete = async (url: string) => {
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'hi', max_tokens: 1 }),
    });
    return { status: res.status, body: await res.text(), retryAfter: res.headers.get('retry-after') };
  };
  const breakerAt = async (url: string) => {
    const body = (await (await fetch(`${url}/health`)).json()) as { backends: { model_id: string; breaker_state: string; breaker_consecutive_failures: number; breaker_last_failure_kind: string | null }[] };
    return body.backends.find((b) => b.model_id === 'flaky')!;
  };

  it('failures through gateway 1 open the breaker; gateway 2 sees it open and refuses without contacting the engine', async () => {
    engine.mode = '500';
    for (let i = 0; i < threshold; i++) assert.is((await complete(urls[0])).status, 502);
    assert.is((await breakerAt(urls[0])).breaker_state, 'open');
    // Seen from the log by the other process (its own requests never failed).
    const seen = await until('gateway 2 to see the breaker open', async () => {
      const b = await breakerAt(urls[1]);
      return b.breaker_state === 'open' ? b : null;
    });
    assert.is(seen.breaker_consecutive_failures, threshold);
    assert.is(seen.breaker_last_failure_kind, 'upstream_server_error');
    const received = engine.received;
    const refused = await complete(urls[1]);
    assert.is(refused.status, 503, refused.body);
    assert.is(JSON.parse(refused.body).error.code, 'circuit_open');
    assert.ok(Number(refused.retryAfter) >= 1);
    assert.is(engine.received, received, 'gateway 2 did not contact the engine');
  });

  it('when the cooldown ends, only one of the two gateways sends the half-open probe', async () => {
    await until('the cooldown to end on both', async () => (await breakerAt(urls[0])).breaker_state === 'half_open' && (await breakerAt(urls[1])).breaker_state === 'half_open');
    engine.mode = 'ok';
    engine.delayMs = 500; // the probe is still under way when the others ask
    const received = engine.received;
    const results = await Promise.all([0, 1, 0, 1, 0, 1].map((i) => complete(urls[i])));
    assert.is(engine.received, received + 1, `exactly one probe reached the engine: ${JSON.stringify(results.map((r) => r.status))}`);
    assert.equal(results.map((r) => r.status).sort(), [200, 503, 503, 503, 503, 503]);
    engine.delayMs = 0;
    for (const url of urls) {
      await until('both to see the breaker closed', async () => (await breakerAt(url)).breaker_state === 'closed');
    }
    assert.is((await complete(urls[1])).status, 200);
    assert.is((await complete(urls[0])).status, 200);
  });
}

it.run();
