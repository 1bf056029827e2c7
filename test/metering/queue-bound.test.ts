/**
 * The contract's "64 queued per key" across gateway processes: two `svc serve` gateways on one
 * PostgreSQL database and one reference engine. With the key's 16 active slots taken by slow
 * requests, 100 more arrive, 50 through each gateway: each process alone is under 64, so a bound
 * counted per process would queue all 100. At most 64 may wait; the rest are refused 429 queue_full,
 * and every request that waited completes once the slow ones end.
 * PostgreSQL only (PGlite belongs to one process): skipped without DATABASE_URL.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createInterface } from 'node:readline';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { issueKey } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { openEventStore, type EventStore } from '../../src/store/index.ts';
import { meterDecider, queuedRequests } from '../../commands/meter.ts';
import { meterEvents, meterStream, utcDay, type MeterEvent } from '../../events/meter.ts';

const svc = fileURLToPath(new URL('../../bin/svc.js', import.meta.url));
const databaseUrl = process.env.DATABASE_URL;
const adminToken = `svc_admin_${randomBytes(12).toString('hex')}`;
/** Long, so no hold or queue entry lapses on a loaded runner while the slow requests run. */
const ttlMs = 120_000;
/** Each slow request's one token takes this long at the engine: the window in which the queue fills. */
const slowMs = 10_000;

interface Context {
  dir: string;
  dbUrl: string;
  dbName: string;
  engineUrl: string;
  config: string;
  gateways: { child: ChildProcess; url: string }[];
  store: EventStore;
}

const children = new Set<ChildProcess>();
process.once('exit', () => {
  for (const child of children) child.kill('SIGKILL');
});

function waitForLine(child: ChildProcess, stream: 'stdout' | 'stderr', pattern: RegExp): Promise<RegExpMatchArray> {
  return new Promise((resolve, reject) => {
    let seen = '';
    const timer = setTimeout(() => reject(new Error(`no ${pattern} within 90 s: ${seen.slice(-2000)}`)), 90_000);
    createInterface({ input: child[stream]! }).on('line', (line) => {
      seen += `${line}\n`;
      const m = line.match(pattern);
      if (m) {
        clearTimeout(timer);
        resolve(m);
      }
    });
    child.once('exit', (code) => reject(new Error(`process exited ${code}: ${seen.slice(-2000)}`)));
  });
}

async function startGateway(context: Context): Promise<{ child: ChildProcess; url: string }> {
  const dataDir = mkdtempSync(join(context.dir, 'gw-'));
  const child = spawn(process.execPath, [svc, 'serve'], {
    env: { ...process.env, DATABASE_URL: context.dbUrl, SVC_CONFIG: context.config, PORT: '0', DATA_DIR: dataDir, SVC_ADMIN_TOKEN: adminToken, SVC_RESERVATION_TTL_MS: String(ttlMs), LOG_LEVEL: 'warn' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.add(child);
  child.stdout!.resume();
  const [, url] = await waitForLine(child, 'stderr', /listening on (http:\/\/\S+)/);
  return { child, url };
}

async function chaos(context: Context, body: Record<string, unknown>): Promise<void> {
  const res = await fetch(`${context.engineUrl}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  assert.is(res.status, 200);
}

async function meterEventsOf(context: Context, key: string): Promise<MeterEvent[]> {
  const read = await context.store.readStream(meterStream(key.split('_')[1], utcDay(new Date())));
  return read.events.map((e) => meterEvents.parse(e));
}

async function complete(url: string, key: string, body: Record<string, unknown>): Promise<{ status: number; code: string | undefined }> {
  const res = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` }, body: JSON.stringify(body) });
  const json = (await res.json()) as { error?: { code: string } };
  return { status: res.status, code: json.error?.code };
}

const it = suite<Context>('64 queued per key across two gateway processes');

if (!databaseUrl) {
  it('skipped: set DATABASE_URL to run the cross-process tests (two gateways need one PostgreSQL)', () => {});
} else {
  it.before(async (context) => {
    context.dir = mkdtempSync(join(tmpdir(), 'svc-queue-'));
    context.dbName = `svc_queue_${randomBytes(5).toString('hex')}`;
    const admin = new pg.Client({ connectionString: databaseUrl });
    await admin.connect();
    await admin.query(`CREATE DATABASE ${context.dbName}`);
    await admin.end();
    const dbUrl = new URL(databaseUrl);
    dbUrl.pathname = `/${context.dbName}`;
    context.dbUrl = dbUrl.toString();

    const engine = spawn(process.execPath, [svc, 'engine', '--model', 'ref-byte', '--chaos'], { env: { ...process.env, DATABASE_URL: '' }, stdio: ['ignore', 'pipe', 'pipe'] });
    children.add(engine);
    engine.stderr!.resume();
    const [, line] = await waitForLine(engine, 'stdout', /^(\{.*"listening".*\})$/);
    context.engineUrl = JSON.parse(line).url;

    const defaults = JSON.parse(readFileSync(fileURLToPath(new URL('../../infra/config/default.json', import.meta.url)), 'utf8'));
    const model = defaults.models.find((m: { id: string }) => m.id === 'ref-byte');
    context.config = join(context.dir, 'models.json');
    writeFileSync(context.config, JSON.stringify({ ...defaults, models: [{ ...model, engine: context.engineUrl }] }));
    context.gateways = [];
    context.gateways.push(await startGateway(context)); // the first one runs the migrations alone
    context.gateways.push(await startGateway(context));
    context.store = await openEventStore({ databaseUrl: context.dbUrl });
  });

  it.after(async (context) => {
    await context.store?.close();
    for (const child of children) child.kill('SIGTERM');
    await Promise.all([...children].map((c) => (c.exitCode === null && c.signalCode === null ? new Promise((r) => c.once('exit', r)) : null)));
    if (context.dbName) {
      const admin = new pg.Client({ connectionString: databaseUrl });
      await admin.connect();
      await admin.query(`DROP DATABASE IF EXISTS ${context.dbName} WITH (FORCE)`);
      await admin.end();
    }
    if (context.dir) rmSync(context.dir, { recursive: true, force: true });
  });

  it('16 slow requests running, 100 more split across both gateways: at most 64 wait, the rest 429 queue_full, every waiter completes', async (context) => {
    const [a, b] = context.gateways;
    const key = await issueKey(a.url, adminToken, { email: 'queue-bound@example.org' });
    for (const gw of [a, b]) assert.is((await complete(gw.url, key, { prompt: 'warm', max_tokens: 1, temperature: 0 })).status, 200);

    await chaos(context, { mode: 'delay', count: 16, delay_ms: slowMs });
    const slow = Array.from({ length: 16 }, (_, i) => complete((i % 2 === 0 ? a : b).url, key, { prompt: 'slow', max_tokens: 1, temperature: 0 }));
    await until('16 slow requests hold every active slot', async () => {
      const events = await meterEventsOf(context, key);
      return events.filter((e) => e.type === 'BudgetReserved').length === 18;
    });

    const queued = await Promise.all(Array.from({ length: 100 }, (_, i) => complete((i % 2 === 0 ? a : b).url, key, { prompt: 'q', max_tokens: 1, temperature: 0 })));
    const slowDone = await Promise.all(slow);
    for (const r of slowDone) assert.is(r.status, 200);

    const served = queued.filter((r) => r.status === 200);
    const refused = queued.filter((r) => r.status !== 200);
    for (const r of refused) assert.equal([r.status, r.code], [429, 'queue_full']);
    assert.ok(served.length <= 64, `${served.length} requests waited for a slot (bound 64 across both processes)`);
    assert.ok(refused.length >= 36, `${refused.length} refused queue_full`);

    // The meter agrees: at no point did more than 64 entries stand, and none is left.
    const events = await until('every waiter reserved and settled', async () => {
      const all = await meterEventsOf(context, key);
      return all.filter((e) => e.type === 'UsageSettled').length === 2 + 16 + served.length ? all : null;
    });
    let state = meterDecider.initialState();
    let peak = 0;
    for (const event of events) {
      state = meterDecider.evolve(state, event);
      if (event.type === 'RequestQueued') peak = Math.max(peak, queuedRequests(state, Date.parse(event.data.at)));
    }
    assert.ok(peak <= 64, `${peak} queue entries stood at once`);
    assert.is(Object.keys(state.queue).length, 0, 'every entry left with its reservation');
    const holders = new Set(events.flatMap((e) => (e.type === 'RequestQueued' ? [e.data.holder] : [])));
    assert.is(holders.size, 2, 'both gateways queued requests');
  });
}

it.run();
