/**
 * DATA_DIR is owner-only: a real `svc serve` creates its embedded store (initdb included), admin token
 * and lock with no access for group or others, and on start tightens a directory an earlier release or
 * a copy left wider, saying so in one line.
 */
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { svcCommand, packageRoot } from '../../src/config/index.ts';
import { freshDataDir } from '../support/data-dir.ts';

const adminToken = 'data-dir-permissions-test-token';

/** Starts `svc serve` on `dataDir` and resolves once it listens, with what it wrote to stderr. */
function serve(dataDir: string, extraEnv: NodeJS.ProcessEnv = {}): Promise<{ child: ChildProcess; url: string; stderr: () => string }> {
  const env: NodeJS.ProcessEnv = { ...process.env, DATA_DIR: dataDir, PORT: '0', LOG_LEVEL: 'warn', SVC_HARVEST_WORKERS: '0', ...extraEnv };
  delete env.DATABASE_URL;
  return new Promise((resolve, reject) => {
    // The test's own umask stays the usual 022: what is owner-only is the server's doing.
    const child = spawn(process.execPath, [...svcCommand(), 'serve'], { cwd: packageRoot, env, stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr!.on('data', (d) => {
      stderr += d;
      const m = /svc gateway listening on (\S+)\n/.exec(stderr);
      if (m) resolve({ child, url: m[1], stderr: () => stderr });
    });
    child.once('exit', (code) => reject(new Error(`svc serve exited (${code}): ${stderr}`)));
  });
}

async function stop(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null) return;
  const exited = new Promise((resolve) => child.once('exit', resolve));
  child.kill('SIGTERM');
  await exited;
}

/** Every entry under `dir` (itself included) whose mode gives group or others any access. */
function openToOthers(dir: string): string[] {
  const wide: string[] = [];
  const visit = (path: string) => {
    const stat = lstatSync(path);
    if (stat.isSymbolicLink()) return;
    if ((stat.mode & 0o077) !== 0) wide.push(`${path.slice(dir.length) || '/'} ${(stat.mode & 0o777).toString(8)}`);
    if (stat.isDirectory()) for (const name of readdirSync(path)) visit(join(path, name));
  };
  visit(dir);
  return wide;
}

async function issueKey(url: string, token: string): Promise<void> {
  const res = await fetch(`${url}/admin/keys`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ email: 'perm@example.com' }),
  });
  assert.is(res.status, 201);
}

test('a new DATA_DIR: the store, its WAL, the admin token and the lock are created owner-only', async () => {
  const parent = mkdtempSync(join(tmpdir(), 'svc-perm-new-'));
  const dataDir = join(parent, 'data'); // missing: svc serve creates it and runs initdb
  try {
    const gateway = await serve(dataDir);
    try {
      const token = /admin token \(shown once, stored in .*?\): (\S+)/.exec(gateway.stderr())?.[1];
      assert.ok(token, 'the generated admin token is printed once');
      await issueKey(gateway.url, token); // an e-mail and a secret hash reach the WAL
      assert.equal(openToOthers(dataDir), [], 'while it runs');
    } finally {
      await stop(gateway.child);
    }
    assert.equal(openToOthers(dataDir), [], 'after it stops');
    assert.ok(readdirSync(join(dataDir, 'pglite')).length > 0);
  } finally {
    rmSync(parent, { recursive: true, force: true });
  }
});

test('a DATA_DIR left readable and writable by others is tightened at start, in one line', async () => {
  const dataDir = await freshDataDir('svc-perm-wide-');
  try {
    // What an earlier release left: directories 0755, files 0666, the token 0644, harvest data too.
    mkdirSync(join(dataDir, 'harvest', 'hj_old'), { recursive: true });
    writeFileSync(join(dataDir, 'harvest', 'hj_old', 'manifest.json'), '{}');
    writeFileSync(join(dataDir, 'admin-token'), `${adminToken}\n`);
    const widen = (path: string) => {
      const stat = lstatSync(path);
      chmodSync(path, stat.isDirectory() ? 0o755 : 0o666);
      if (stat.isDirectory()) for (const name of readdirSync(path)) widen(join(path, name));
    };
    widen(dataDir);
    chmodSync(join(dataDir, 'admin-token'), 0o644);
    const before = openToOthers(dataDir).length;
    assert.ok(before > 10);

    const gateway = await serve(dataDir);
    try {
      const lines = gateway.stderr().split('\n').filter((l) => l.includes('owner-only'));
      assert.equal(lines, [`svc: DATA_DIR ${dataDir} gave other users access to ${before} entries; made them owner-only (directories 0700, files 0600)`]);
      await issueKey(gateway.url, adminToken);
      assert.equal(openToOthers(dataDir), []);
    } finally {
      await stop(gateway.child);
    }
    // A second start finds nothing to tighten and says nothing about it.
    const again = await serve(dataDir);
    try {
      assert.not.match(again.stderr(), /owner-only/);
    } finally {
      await stop(again.child);
    }
    assert.equal(openToOthers(dataDir), []);
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
});

test.run();
