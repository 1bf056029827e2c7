import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { constants, cpSync, existsSync, mkdtempSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { Writable } from 'node:stream';
import { pathToFileURL } from 'node:url';
import { loadSettings, type Settings } from '../../src/config/index.ts';
import { startGateway, type Gateway, type GatewayOptions } from '../../src/gateway/index.ts';

export interface TestGateway extends Gateway {
  /** Every log line the gateway wrote, as text. */
  logs(): string;
  dataDir: string;
  /** The admin token this gateway accepts. */
  adminToken: string;
  /** A key issued through the real admin API at start (no budgets). */
  apiKey: string;
  /** `{ authorization: 'Bearer <apiKey>' }`, merged with `extra`. */
  authHeaders(extra?: Record<string, string>): Record<string, string>;
  /** `{ authorization: 'Bearer <adminToken>' }`, merged with `extra`. */
  adminHeaders(extra?: Record<string, string>): Record<string, string>;
  stop(): Promise<void>;
}

/** Issues a key through the admin API of a running gateway; returns the full key. */
export async function issueKey(url: string, adminToken: string, body: Record<string, unknown> = { email: 'tests@example.org' }): Promise<string> {
  const res = await fetch(`${url}/admin/keys`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${adminToken}` }, body: JSON.stringify(body) });
  const text = await res.text();
  if (res.status !== 201) throw new Error(`issuing a test key failed: ${res.status} ${text}`);
  return JSON.parse(text).key;
}

let template: Promise<string> | undefined;

/**
 * An empty PGlite database directory, made once per machine and PGlite version: initdb costs seconds of
 * CPU in a child process (~800 MB of heap) on every gateway start, a copy of its result a tenth of a
 * second. Made beside its final path and renamed into place, so a concurrent test file never sees half of one.
 */
function pgliteTemplate(): Promise<string> {
  template ??= (async () => {
    const entry = createRequire(import.meta.url).resolve('@electric-sql/pglite');
    let pkg = dirname(entry);
    while (!existsSync(join(pkg, 'package.json'))) pkg = dirname(pkg);
    const { version } = JSON.parse(readFileSync(join(pkg, 'package.json'), 'utf8')) as { version: string };
    const dir = join(tmpdir(), `svc-test-pglite-${version}`);
    if (existsSync(join(dir, 'PG_VERSION'))) return dir;
    const making = mkdtempSync(`${dir}-making-`);
    const script = `const { PGlite } = await import(${JSON.stringify(pathToFileURL(entry).href)}); const db = await PGlite.create(process.argv[1]); await db.close();`;
    const code = await new Promise((resolve) => spawn(process.execPath, ['--input-type=module', '-e', script, join(making, 'pglite')], { stdio: 'inherit' }).once('exit', resolve));
    if (code !== 0) throw new Error(`making the PGlite template failed (${code})`);
    try {
      renameSync(join(making, 'pglite'), dir);
    } catch (error) {
      if (!existsSync(join(dir, 'PG_VERSION'))) throw error; // another file made it meanwhile
    } finally {
      rmSync(making, { recursive: true, force: true });
    }
    return dir;
  })();
  return template;
}

/** A fresh data directory holding a copy of the empty PGlite database the gateway would otherwise create. */
export async function freshDataDir(prefix = 'svc-test-'): Promise<string> {
  const dataDir = mkdtempSync(join(tmpdir(), prefix));
  cpSync(await pgliteTemplate(), join(dataDir, 'pglite'), { recursive: true, mode: constants.COPYFILE_FICLONE });
  return dataDir;
}

/** A real gateway on port 0 with a fresh PGlite data directory and real reference engine processes. */
export async function startTestGateway(overrides: Partial<Settings> = {}, options: Pick<GatewayOptions, 'chaosEngines' | 'engineBootKnobs'> = {}): Promise<TestGateway> {
  const dataDir = await freshDataDir();
  const chunks: string[] = [];
  const logDestination = new Writable({
    write(chunk, _encoding, callback) {
      chunks.push(String(chunk));
      callback();
    },
  });
  // Engines warm at start unless a test says otherwise: most tests are not about cold boots (test/api/cold-boot.test.ts is).
  const settings = loadSettings({ SVC_ENGINE_WARM_AT_START: 'on', ...process.env, DATA_DIR: dataDir, PORT: '0', HOST: '127.0.0.1', DATABASE_URL: '' }, overrides);
  const adminToken = `svc_admin_test_${randomBytes(12).toString('hex')}`;
  const gateway = await startGateway(settings, { logDestination: logDestination as never, chaosEngines: options.chaosEngines, engineBootKnobs: options.engineBootKnobs, adminToken });
  let apiKey: string;
  try {
    apiKey = await issueKey(gateway.url, adminToken);
  } catch (err) {
    await gateway.close();
    throw err;
  }
  return {
    ...gateway,
    dataDir,
    adminToken,
    apiKey,
    authHeaders: (extra = {}) => ({ authorization: `Bearer ${apiKey}`, ...extra }),
    adminHeaders: (extra = {}) => ({ authorization: `Bearer ${adminToken}`, ...extra }),
    logs: () => chunks.join(''),
    stop: async () => {
      await gateway.close();
      rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

export async function json(res: Response): Promise<any> {
  const text = await res.text();
  try {
    return JSON.parse(text);
  } catch {
    throw new Error(`not JSON (status ${res.status}): ${text.slice(0, 300)}`);
  }
}
