/**
 * The real `svc audit` and `svc events` processes on an embedded (PGlite) data directory: refused
 * with DataDirLocked while another process holds it, then run against it once it is free.
 */
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn } from 'node:child_process';
import { rmSync } from 'node:fs';
import { svcCommand, packageRoot } from '../../src/config/index.ts';
import { openEventStore } from '../../src/store/index.ts';
import { ProjectionRunner } from '../../src/processors/index.ts';
import { meterStream } from '../../events/meter.ts';
import { projections } from '../../projections/index.ts';
import { mixedWorkload } from '../support/meter-workload.ts';
import { freshDataDir } from '../support/data-dir.ts';

// A copy of an empty embedded database, not a new one (seconds of CPU).
const dataDir = await freshDataDir('svc-audit-');

function svc(args: string[], until?: { lines: number }): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    const env: NodeJS.ProcessEnv = { ...process.env, DATA_DIR: dataDir };
    delete env.DATABASE_URL;
    const child = spawn(process.execPath, [...svcCommand(), ...args], { cwd: packageRoot, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => {
      stdout += d;
      // `tail` runs until told to stop: stop it once it printed what we wait for.
      if (until && stdout.split('\n').length - 1 >= until.lines) child.kill('SIGTERM');
    });
    child.stderr.on('data', (d) => (stderr += d));
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

test('svc audit usage and svc events read/tail as processes: DataDirLocked while the store is held, then exit 0 with the answers', async () => {
  const store = await openEventStore({ dataDir, purpose: 'svc serve (test)' });
  let workload;
  try {
    const runner = new ProjectionRunner({ store, projections });
    await runner.start();
    workload = await mixedWorkload(store);
    await runner.caughtUp();
    await runner.stop();
    const locked = await svc(['events', 'read', meterStream(workload.a.keyId, '2026-11-29')]);
    assert.is(locked.code, 1);
    assert.match(locked.stderr, /is in use by another process \(pid \d+, svc serve \(test\)/);
  } finally {
    await store.close();
  }
  const audit = await svc(['audit', 'usage', '--key', workload.a.keyId, '--month', '2026-11']);
  assert.is(audit.code, 0, audit.stderr + audit.stdout);
  assert.match(audit.stdout, 'agree: 3 period(s)');

  const read = await svc(['events', 'read', meterStream(workload.a.keyId, '2026-11-29'), '--json']);
  assert.is(read.code, 0, read.stderr);
  assert.equal(
    read.stdout.trim().split('\n').map((l) => JSON.parse(l).type),
    ['MeterOpened', 'BudgetReserved', 'UsageSettled', 'BudgetReserved', 'RequestRejected', 'ReservationExpired', 'LateUsageRecorded'],
  );

  const tail = await svc(['events', 'tail', '--from', 'start', '--json'], { lines: 5 });
  assert.is(tail.code, 0, tail.stderr);
  assert.equal(tail.stdout.trim().split('\n').slice(0, 2).map((l) => JSON.parse(l).type), ['KeyIssued', 'KeyIssued']);
});

test.after(() => rmSync(dataDir, { recursive: true, force: true }));
test.run();
