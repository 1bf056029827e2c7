import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { loadSettings, type Settings } from '../../src/config/index.ts';
import { startGateway, type Gateway } from '../../src/gateway/index.ts';

export interface TestGateway extends Gateway {
  /** Every log line the gateway wrote, as text. */
  logs(): string;
  dataDir: string;
  stop(): Promise<void>;
}

/** A real gateway on port 0 with a fresh PGlite data directory and real reference engine processes. */
export async function startTestGateway(overrides: Partial<Settings> = {}, options: { chaosEngines?: boolean } = {}): Promise<TestGateway> {
  const dataDir = mkdtempSync(join(tmpdir(), 'svc-test-'));
  const chunks: string[] = [];
  const logDestination = new Writable({
    write(chunk, _encoding, callback) {
      chunks.push(String(chunk));
      callback();
    },
  });
  const settings = loadSettings({ ...process.env, DATA_DIR: dataDir, PORT: '0', HOST: '127.0.0.1', DATABASE_URL: '' }, overrides);
  const gateway = await startGateway(settings, { logDestination: logDestination as never, chaosEngines: options.chaosEngines });
  return {
    ...gateway,
    dataDir,
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
