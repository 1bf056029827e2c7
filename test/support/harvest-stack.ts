/**
 * Harvests across real processes: one shared reference engine (`svc engine --chaos`, so a test can
 * slow it down), and `svc serve` / `svc worker` processes started and killed at will, on the embedded
 * store (one data directory, one process at a time) or on a fresh PostgreSQL database. They share one
 * harvest directory (SVC_HARVEST_DIR), as a deployment's processes share one volume.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startChaosEngine, waitForLine } from './gateway-cluster.ts';
import { scratchDatabase } from './postgres.ts';
import { openEventStore, type EventStore } from '../../src/store/index.ts';

const svc = fileURLToPath(new URL('../../bin/svc.js', import.meta.url));

export interface HarvestStack {
  readonly adminToken: string;
  /** The shared reference engine (its /metrics count the generations running at once). */
  readonly engineUrl: string;
  readonly harvestDir: string;
  readonly databaseUrl: string | null;
  /** `svc serve` (args: `--no-workers`, say) with these extra environment variables; resolves once it listens (`spawned`: told the process at once). */
  serve(env?: Record<string, string>, args?: string[], spawned?: (child: ChildProcess) => void): Promise<{ child: ChildProcess; url: string }>;
  /** `svc worker` (PostgreSQL only); resolves once it works. */
  worker(env?: Record<string, string>, spawned?: (child: ChildProcess) => void): Promise<ChildProcess>;
  /** Sets the shared engine's failure mode (`{ mode: 'delay', count, delay_ms }`, `{ mode: 'none' }`). */
  chaos(body: Record<string, unknown>): Promise<void>;
  /** The store the processes write (open it once every process that holds the embedded store is gone). */
  openStore(): Promise<EventStore>;
  stop(): Promise<void>;
}

export async function startHarvestStack(options: {
  name: string;
  postgres: string | null;
  env?: Record<string, string>;
  /** Changes the ref-byte model's entry in the processes' models file (its capabilities' limits, say). */
  model?: (model: Record<string, any>) => Record<string, any>;
}): Promise<HarvestStack> {
  const dir = mkdtempSync(join(tmpdir(), `svc-${options.name}-`));
  const children = new Set<ChildProcess>();
  const killAll = () => children.forEach((c) => c.kill('SIGKILL'));
  process.once('exit', killAll);
  const database = options.postgres ? await scratchDatabase(options.postgres, options.name) : null;
  const adminToken = `svc_admin_${randomBytes(12).toString('hex')}`;
  const dataDir = join(dir, 'data');
  const harvestDir = join(dir, 'harvest');
  mkdirSync(dataDir);
  const stores: EventStore[] = [];

  const engine = await startChaosEngine(dir, options.model);
  children.add(engine.child);
  const { url: engineUrl, config } = engine;

  const spawnSvc = (args: string[], env: Record<string, string>) => {
    const child = spawn(process.execPath, [svc, ...args], {
      env: {
        ...process.env,
        DATABASE_URL: database?.url ?? '',
        SVC_CONFIG: config,
        PORT: '0',
        DATA_DIR: database ? mkdtempSync(join(dir, 'proc-')) : dataDir,
        SVC_HARVEST_DIR: harvestDir,
        SVC_ADMIN_TOKEN: adminToken,
        LOG_LEVEL: 'warn',
        ...(database ? { SVC_HARVEST_TRANSPORT: 'postgres' } : {}),
        ...options.env,
        ...env,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    children.add(child);
    child.stdout!.resume();
    child.once('exit', () => children.delete(child));
    return child;
  };

  return {
    adminToken,
    engineUrl,
    harvestDir,
    databaseUrl: database?.url ?? null,
    async serve(env = {}, args = [], spawned) {
      const child = spawnSvc(['serve', ...args], env);
      spawned?.(child);
      const [, url] = await waitForLine(child, 'stderr', /listening on (http:\/\/\S+)/);
      return { child, url };
    },
    async worker(env = {}, spawned) {
      const child = spawnSvc(['worker'], env);
      spawned?.(child);
      await waitForLine(child, 'stderr', /svc worker working on harvest jobs/);
      return child;
    },
    chaos: engine.chaos,
    async openStore() {
      const store = await openEventStore(database ? { databaseUrl: database.url } : { dataDir });
      stores.push(store);
      return store;
    },
    async stop() {
      for (const store of stores) await store.close().catch(() => undefined);
      for (const child of children) child.kill('SIGTERM');
      await Promise.all([...children].map((c) => (c.exitCode === null && c.signalCode === null ? new Promise((r) => c.once('exit', r)) : null)));
      process.off('exit', killAll);
      await database?.drop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

/** Kills a process at once (no drain, no cleanup: a crash) and waits until it is gone. */
export async function crash(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once('exit', r));
  child.kill('SIGKILL');
  await gone;
}
