/**
 * Rules that cross processes are proven with real processes: this starts `svc serve` gateways on one
 * fresh PostgreSQL database (created beside DATABASE_URL's, dropped at the end) in front of one
 * shared reference engine (`svc engine --chaos`, so concurrency is counted at the engine and failures
 * can be injected), with one admin token, and reads the store beside them. GATEWAY_LOG_DIR=dir keeps
 * each gateway's log there (metadata only), to see why a run failed.
 */
import * as assert from 'uvu/assert';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createInterface } from 'node:readline';
import { createWriteStream, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { openEventStore, type EventStore } from '../../src/store/index.ts';
import { meterEvents, meterStream, utcDay, type MeterEvent } from '../../events/meter.ts';

const svc = fileURLToPath(new URL('../../bin/svc.js', import.meta.url));

export interface Gateway {
  child: ChildProcess;
  url: string;
}

export interface GatewayCluster {
  readonly adminToken: string;
  readonly engine: ChildProcess;
  readonly engineUrl: string;
  /** The gateways started with the cluster, in order. */
  readonly gateways: Gateway[];
  /** The cluster's store, opened beside the gateways (for reading what they wrote). */
  readonly store: EventStore;
  /** Starts one more gateway on the cluster's database, with this reservation TTL. */
  startGateway(ttlMs: number): Promise<Gateway>;
  /** Sets the shared engine's failure mode (`{ mode: 'delay', count, delay_ms }`, `{ mode: 'none' }`, ...). */
  chaos(body: Record<string, unknown>): Promise<void>;
  /** Today's meter events of a key (its key string, `svc_<prefix>_...`). */
  meterEventsOf(key: string): Promise<MeterEvent[]>;
  /** Stops every process, closes the store, drops the database. */
  stop(): Promise<void>;
}

/** Resolves with the first line of the child's stream that matches, or rejects after 90 s or when it exits. */
export function waitForLine(child: ChildProcess, stream: 'stdout' | 'stderr', pattern: RegExp): Promise<RegExpMatchArray> {
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
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`process exited ${code}: ${seen.slice(-2000)}`));
    });
  });
}

/** The shared reference engine of the multi-process tests: `svc engine --chaos`, so a test can slow it down or make it fail. */
export interface ChaosEngine {
  readonly child: ChildProcess;
  readonly url: string;
  /** A models file (SVC_CONFIG) for the processes: infra/config/default.json with one model, ref-byte, on this engine. */
  readonly config: string;
  /** Sets the engine's failure mode (`{ mode: 'delay', count, delay_ms }`, `{ mode: 'none' }`, ...). */
  chaos(body: Record<string, unknown>): Promise<void>;
}

/**
 * Starts the reference engine (ref-byte) and writes its models file into `dir`; `model` changes the
 * model's entry (its capabilities' limits, say). The caller stops the child; it is killed here if it
 * never listens.
 */
export async function startChaosEngine(dir: string, model: (model: Record<string, any>) => Record<string, any> = (m) => m): Promise<ChaosEngine> {
  const child = spawn(process.execPath, [svc, 'engine', '--model', 'ref-byte', '--chaos'], { env: { ...process.env, DATABASE_URL: '' }, stdio: ['ignore', 'pipe', 'pipe'] });
  child.stderr!.resume();
  let url: string;
  try {
    const [, line] = await waitForLine(child, 'stdout', /^(\{.*"listening".*\})$/);
    url = JSON.parse(line).url as string;
  } catch (error) {
    child.kill('SIGKILL');
    throw error;
  }
  const defaults = JSON.parse(readFileSync(fileURLToPath(new URL('../../infra/config/default.json', import.meta.url)), 'utf8'));
  const refByte = defaults.models.find((m: { id: string }) => m.id === 'ref-byte');
  const config = join(dir, 'models.json');
  writeFileSync(config, JSON.stringify({ ...defaults, models: [{ ...model(refByte), engine: url }] }));
  return {
    child,
    url,
    config,
    async chaos(body) {
      const res = await fetch(`${url}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      assert.is(res.status, 200);
    },
  };
}

/** A cluster of `gateways` gateways with reservation TTL `ttlMs` (more can be started later). */
export async function startGatewayCluster(databaseUrl: string, options: { name: string; gateways: number; ttlMs: number }): Promise<GatewayCluster> {
  const adminToken = `svc_admin_${randomBytes(12).toString('hex')}`;
  const children = new Set<ChildProcess>();
  const killAll = () => {
    for (const child of children) child.kill('SIGKILL');
  };
  process.once('exit', killAll);
  const dir = mkdtempSync(join(tmpdir(), `svc-${options.name}-`));
  const dbName = `svc_${options.name}_${randomBytes(5).toString('hex')}`;
  const admin = async (sql: string) => {
    const client = new pg.Client({ connectionString: databaseUrl });
    await client.connect();
    await client.query(sql).finally(() => client.end());
  };
  await admin(`CREATE DATABASE ${dbName}`);
  const dbUrl = new URL(databaseUrl);
  dbUrl.pathname = `/${dbName}`;
  let store: EventStore | null = null;
  const gateways: Gateway[] = [];

  const stop = async () => {
    await store?.close();
    for (const child of children) child.kill('SIGTERM');
    await Promise.all([...children].map((c) => (c.exitCode === null && c.signalCode === null ? new Promise((r) => c.once('exit', r)) : null)));
    process.off('exit', killAll);
    await admin(`DROP DATABASE IF EXISTS ${dbName} WITH (FORCE)`);
    rmSync(dir, { recursive: true, force: true });
  };

  try {
    const engine = await startChaosEngine(dir);
    children.add(engine.child);
    const config = engine.config;

    const startGateway = async (ttlMs: number): Promise<Gateway> => {
      const dataDir = mkdtempSync(join(dir, 'gw-'));
      const child = spawn(process.execPath, [svc, 'serve'], {
        env: { ...process.env, DATABASE_URL: dbUrl.toString(), SVC_CONFIG: config, PORT: '0', DATA_DIR: dataDir, SVC_ADMIN_TOKEN: adminToken, SVC_RESERVATION_TTL_MS: String(ttlMs), LOG_LEVEL: 'warn' },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      children.add(child);
      child.stdout!.resume();
      if (process.env.GATEWAY_LOG_DIR) {
        const out = createWriteStream(join(process.env.GATEWAY_LOG_DIR, `gw-${child.pid}.log`));
        child.stderr!.pipe(out);
        child.stdout!.pipe(out);
      }
      const [, url] = await waitForLine(child, 'stderr', /listening on (http:\/\/\S+)/);
      return { child, url };
    };
    // One at a time: the first one runs the migrations alone.
    for (let i = 0; i < options.gateways; i++) await startGateway(options.ttlMs).then((g) => gateways.push(g));
    store = await openEventStore({ databaseUrl: dbUrl.toString() });
    const opened = store;
    return {
      adminToken,
      engine: engine.child,
      engineUrl: engine.url,
      store: opened,
      startGateway,
      chaos: engine.chaos,
      async meterEventsOf(key) {
        const read = await opened.readStream(meterStream(key.split('_')[1], utcDay(new Date())));
        return read.events.map((e) => meterEvents.parse(e));
      },
      gateways,
      stop,
    };
  } catch (error) {
    await stop();
    throw error;
  }
}
