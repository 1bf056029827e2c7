// `npm start` as a user or a supervisor runs it, and stopped the ways they stop it: SIGTERM to the npm
// process, SIGINT to the whole process group (a terminal's Ctrl-C). Nothing may be left behind: no
// process of the group, no listener on the port, no lock on the data directory. A second `svc serve`
// on a taken port or data directory says so in one line, before starting anything.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { freshDataDir } from '../support/data-dir.ts';
import { until } from '../support/until.ts';
import { within } from '../support/within.ts';
import { freePort } from '../support/ports.ts';

const root = fileURLToPath(new URL('../..', import.meta.url));
const graceMs = 5_000;

async function portFree(port: number): Promise<boolean> {
  const server = createServer();
  return new Promise((resolve) => {
    server.once('error', () => resolve(false));
    server.listen({ port, host: '127.0.0.1', exclusive: true }, () => server.close(() => resolve(true)));
  });
}

/** Live processes of a process group (zombies are gone already as far as a port or a lock goes). */
function groupMembers(pgid: number): string[] {
  const members: string[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
      if (Number(fields[2]) === pgid && fields[0] !== 'Z') members.push(`${name} ${readFileSync(`/proc/${name}/cmdline`, 'utf8').replaceAll('\0', ' ').trim()}`);
    } catch {
      // gone meanwhile
    }
  }
  return members;
}

interface Started {
  npm: ChildProcess;
  url: string;
  port: number;
  dataDir: string;
  enginePids: number[];
  output: () => string;
  /** Resolves once every process holding npm's stdout and stderr has gone and their last bytes were read. */
  outputClosed: Promise<unknown>;
}

/**
 * `npm start`, as the README says, in a process group of its own (as a shell runs a job); its engines warm at
 * start, so their stop is checked too. The data directory is empty unless given: the database is created at start.
 */
async function npmStart(dataDir = mkdtempSync(join(tmpdir(), 'svc-npm-start-'))): Promise<Started> {
  const port = await freePort();
  const npm = spawn('npm', ['start'], {
    cwd: root,
    detached: true,
    env: { ...process.env, DATA_DIR: dataDir, PORT: String(port), DATABASE_URL: '', SVC_ADMIN_TOKEN: '', SVC_SHUTDOWN_GRACE_MS: String(graceMs), npm_config_update_notifier: 'false', SVC_ENGINE_WARM_AT_START: 'on' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  npm.stdout!.on('data', (d) => (output += d));
  npm.stderr!.on('data', (d) => (output += d));
  const outputClosed = Promise.all([once(npm.stdout!, 'close'), once(npm.stderr!, 'close')]);
  outputClosed.catch(() => {});
  const url = await until('npm start listening', async () => {
    if (npm.exitCode !== null) throw new Error(`npm start exited ${npm.exitCode}: ${output}`);
    return output.match(/listening on (http:\/\/\S+)/)?.[1];
  }, 180_000);
  const enginePids = [...output.matchAll(/"pid":(\d+),"msg":"reference engine started"/g)].map((m) => Number(m[1]));
  return { npm, url, port, dataDir, enginePids, output: () => output, outputClosed };
}

async function assertNothingLeft(started: Started, how: string): Promise<void> {
  const lock = join(started.dataDir, 'store.lock');
  const stoppedAt = Date.now();
  await until(`everything stopped after ${how}`, async () => groupMembers(started.npm.pid!).length === 0 && !existsSync(lock) && (await portFree(started.port)), graceMs, 50).catch(() => {
    throw new Error(`after ${how}: left ${JSON.stringify(groupMembers(started.npm.pid!))}, lock ${existsSync(lock) ? 'held' : 'free'}, port ${started.port}\n${started.output()}`);
  });
  assert.ok(Date.now() - stoppedAt <= graceMs, 'within the shutdown grace');
  for (const pid of started.enginePids) assert.throws(() => process.kill(pid, 0), `engine ${pid} stopped`);
  // The gateway's last log lines may still be in the pipe when its process is gone: read them first.
  await within(5_000, started.outputClosed, `npm's output closing after ${how}`);
  assert.match(started.output(), /shutting down: draining in-flight requests/, 'the gateway drained');
  assert.not.match(started.output(), /reference engine exited; restarting/, 'an engine stopped with the gateway is not a crash');
}

function cleanUp(started: Started | undefined): void {
  if (!started) return;
  try {
    process.kill(-started.npm.pid!, 'SIGKILL');
  } catch {
    // already gone
  }
  rmSync(started.dataDir, { recursive: true, force: true });
}

/** `svc serve` run a second time with `env`: its exit code and its stderr. */
async function secondServe(env: Record<string, string>): Promise<{ code: number | null; stderr: string }> {
  const child = spawn(process.execPath, [join(root, 'bin', 'svc.js'), 'serve'], { cwd: root, env: { ...process.env, DATABASE_URL: '', SVC_ADMIN_TOKEN: '', ...env }, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  let stderr = '';
  child.stderr!.on('data', (d) => (stderr += d));
  child.stdout!.resume();
  const code = await new Promise<number | null>((resolve) => child.once('exit', resolve));
  assert.equal(groupMembers(child.pid!), [], 'the refused serve left no process behind');
  return { code, stderr };
}

test('SIGTERM to the npm process stops the gateway and its engines, frees the port and the data directory', async () => {
  let started: Started | undefined;
  try {
    started = await npmStart();
    assert.ok(started.enginePids.length >= 2, 'the reference engines run');
    assert.is((await fetch(`${started.url}/health`)).status, 200);

    // Meanwhile, a second gateway on the same data directory, then on the same port: one line each, nothing started.
    const sameDir = await secondServe({ DATA_DIR: started.dataDir, PORT: String(await freePort()) });
    assert.is(sameDir.code, 1);
    assert.match(sameDir.stderr, /^svc: the data directory .* is in use by another process \(pid \d+, svc serve, since .*\): stop it, or set DATA_DIR to another directory\n$/);
    const otherDir = mkdtempSync(join(tmpdir(), 'svc-npm-start-other-'));
    try {
      const samePort = await secondServe({ DATA_DIR: otherDir, PORT: String(started.port) });
      assert.is(samePort.code, 1);
      assert.match(samePort.stderr, new RegExp(`^svc: port ${started.port} on 127.0.0.1 is already in use \\(another svc serve\\?\\): stop what holds it, or set PORT to a free port\\n$`));
      // Before starting anything: no process left (secondServe), and nothing written to its data directory.
      assert.equal(readdirSync(otherDir), [], 'refused before creating a store or an admin token');
    } finally {
      rmSync(otherDir, { recursive: true, force: true });
    }

    started.npm.kill('SIGTERM');
    await assertNothingLeft(started, 'SIGTERM to npm');
  } finally {
    cleanUp(started);
  }
});

test('SIGINT to the process group (Ctrl-C in a terminal) stops everything too', async () => {
  let started: Started | undefined;
  try {
    // A copy of an empty database (the first test covers its creation at start): seconds of CPU less.
    started = await npmStart(await freshDataDir('svc-npm-start-'));
    process.kill(-started.npm.pid!, 'SIGINT');
    await assertNothingLeft(started, 'SIGINT to the process group');
  } finally {
    cleanUp(started);
  }
});

test('SIGHUP to the process group (the terminal closed) stops everything too', async () => {
  let started: Started | undefined;
  try {
    started = await npmStart(await freshDataDir('svc-npm-start-'));
    process.kill(-started.npm.pid!, 'SIGHUP');
    await assertNothingLeft(started, 'SIGHUP to the process group');
  } finally {
    cleanUp(started);
  }
});

test.run();
