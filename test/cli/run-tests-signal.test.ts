/**
 * The test runner (`npm test`, bin/run-tests.js) stopped with SIGTERM stops the files it runs and
 * whatever they started (gateways, engines): nothing is left re-parented to PID 1.
 */
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { until } from '../support/until.ts';

const runner = fileURLToPath(new URL('../../bin/run-tests.js', import.meta.url));
const alive = (pid: number) => {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
};

const it = suite('npm test stopped');

it('SIGTERM to the runner ends its test files and their children', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'svc-runner-'));
  const pids = join(dir, 'pids');
  try {
    // A test file that starts a long-lived child, as a gateway test starts an engine, and never ends.
    writeFileSync(join(dir, 'hang.test.ts'), `
      import { spawn } from 'node:child_process';
      import { appendFileSync } from 'node:fs';
      const child = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore' });
      appendFileSync(${JSON.stringify(pids)}, process.pid + ' ' + child.pid + '\\n');
      setInterval(() => {}, 1000);
    `);
    const run = spawn(process.execPath, [runner], { env: { ...process.env, TEST_DIR: dir, TEST_CONCURRENCY: '1' }, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    run.stdout.on('data', (d) => (out += d));
    const exited = new Promise<number | null>((resolve) => run.once('exit', (code) => resolve(code)));
    const [file, grandchild] = await until('the test file and its child running', async () => {
      if (!existsSync(pids)) return null;
      const line = readFileSync(pids, 'utf8').trim();
      return line ? line.split(' ').map(Number) : null;
    }, 60_000, 50);
    assert.ok(alive(file) && alive(grandchild));
    run.kill('SIGTERM');
    const code = await exited;
    assert.is.not(code, 0, out);
    await until('the test file and its child gone', async () => !alive(file) && !alive(grandchild), 15_000, 50);
    assert.match(out, /SIGTERM: stopping 1 running test file/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

it.run();
