import { randomBytes } from 'node:crypto';
import { rmSync } from 'node:fs';
import { Writable } from 'node:stream';
import { loadSettings, type Settings } from '../../src/config/index.ts';
import { startGateway, type Gateway, type GatewayOptions } from '../../src/gateway/index.ts';
import { freshDataDir } from './data-dir.ts';

export { freshDataDir };

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

/** A real gateway on port 0 with a fresh PGlite data directory and real reference engine processes. */
export async function startTestGateway(overrides: Partial<Settings> = {}, options: Pick<GatewayOptions, 'chaosEngines' | 'engineBootKnobs' | 'sqlPort' | 'sqlPasswords'> = {}): Promise<TestGateway> {
  const dataDir = await freshDataDir();
  const chunks: string[] = [];
  const logDestination = new Writable({
    write(chunk, _encoding, callback) {
      chunks.push(String(chunk));
      callback();
    },
  });
  // Engines warm at start unless a test says otherwise: most tests are not about cold boots (test/api/cold-boot.test.ts is).
  // An engine process that starts under tsx on a busy machine can take tens of seconds to report: a
  // boot is given up only after two minutes here, unless the test is about that bound.
  const settings = loadSettings({ SVC_ENGINE_WARM_AT_START: 'on', SVC_COLD_BOOT_ACK_TIMEOUT_MS: '120000', ...process.env, DATA_DIR: dataDir, PORT: '0', HOST: '127.0.0.1', DATABASE_URL: '' }, overrides);
  const adminToken = `svc_admin_test_${randomBytes(12).toString('hex')}`;
  const gateway = await startGateway(settings, { logDestination: logDestination as never, chaosEngines: options.chaosEngines, engineBootKnobs: options.engineBootKnobs, sqlPort: options.sqlPort, sqlPasswords: options.sqlPasswords, adminToken });
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
