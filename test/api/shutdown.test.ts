import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import { rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { freshDataDir } from '../support/data-dir.ts';
import { issueKey } from '../support/gateway.ts';

const svc = fileURLToPath(new URL('../../bin/svc.js', import.meta.url));

test('SIGTERM drains an in-flight stream, refuses new connections, stops engines and exits 0', async () => {
  // A copy of an empty database (no admin token yet): the store need not be created (seconds of CPU).
  const dataDir = await freshDataDir('svc-shutdown-');
  const child = spawn(process.execPath, [svc, 'serve'], {
    env: { ...process.env, DATA_DIR: dataDir, PORT: '0', DATABASE_URL: '', SVC_ENGINE_CHAOS: '1', SVC_ADMIN_TOKEN: '', SVC_ENGINE_WARM_AT_START: 'on' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  try {
    const engines = new Map<string, { url: string; pid: number }>();
    let stderr = '';
    const url = await new Promise<string>((resolve, reject) => {
      createInterface({ input: child.stdout! }).on('line', (line) => {
        try {
          const entry = JSON.parse(line);
          if (entry.msg === 'reference engine started') engines.set(entry.model, { url: entry.url, pid: entry.pid });
        } catch {
          /* not a log line */
        }
      });
      child.stderr!.on('data', (d) => {
        stderr += d;
        const m = stderr.match(/listening on (http:\/\/\S+)/);
        if (m) resolve(m[1]);
      });
      child.once('exit', (code) => reject(new Error(`svc serve exited ${code}: ${stderr}`)));
    });
    assert.match(stderr, /admin token \(shown once/, 'the first start prints the generated admin token');
    const apiKey = await issueKey(url, stderr.match(/admin token \(shown once[^)]*\): (\S+)/)![1]);
    const engine = engines.get('ref-byte')!;
    assert.ok(engine, 'the default model has a reference engine');

    // Every token of the next generation takes 100 ms, so the stream is surely in flight at SIGTERM.
    await fetch(`${engine.url}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: 'delay', delay_ms: 100, count: 1 }) });
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'drain me', max_tokens: 12, temperature: 0, stream: true, stream_options: { include_usage: true } }),
    });
    assert.is(res.status, 200);
    const reader = res.body!.getReader();
    const first = await reader.read();
    assert.ok(first.value && first.value.length > 0, 'the stream started');
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    child.kill('SIGTERM');

    let rest = Buffer.from(first.value!).toString('utf8');
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      rest += Buffer.from(value).toString('utf8');
    }
    assert.ok(rest.trimEnd().endsWith('data: [DONE]'), 'the in-flight stream finished whole');
    assert.match(rest, /"choices":\[\]/, 'including its usage frame');

    assert.is(await exited, 0);
    const refused = await fetch(`${url}/health`).then(() => false, () => true);
    assert.ok(refused, 'no longer accepting connections');
    for (const { pid } of engines.values()) {
      assert.throws(() => process.kill(pid, 0), 'engine process stopped');
    }
  } finally {
    if (child.exitCode === null) child.kill('SIGKILL');
    rmSync(dataDir, { recursive: true, force: true });
  }
});

test.run();
