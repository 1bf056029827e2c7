/** The embedded store belongs to one process: a second opener fails with a message that says so. */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { execFile, spawn } from 'node:child_process';
import { hostname } from 'node:os';
import { rmSync, writeFileSync, existsSync, utimesSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';
import { promisify } from 'node:util';
import { DataDirLocked, openEventStore } from '../../src/store/index.ts';
import { event, uniqueStream } from './adapters.ts';
import { freshDataDir } from '../support/data-dir.ts';

const run = promisify(execFile);
const storeModule = fileURLToPath(new URL('../../src/store/index.ts', import.meta.url));
const lockModule = fileURLToPath(new URL('../../src/store/data-dir-lock.ts', import.meta.url));
const root = fileURLToPath(new URL('../..', import.meta.url));

const it = suite<{ dir: string }>('embedded store data directory lock');
it.before(async (context) => {
  // A copy of an empty database: what is tested is the lock, not creating one (seconds of CPU).
  context.dir = await freshDataDir('svc-store-lock-');
});
it.after(({ dir }) => {
  rmSync(dir, { recursive: true, force: true });
});

it('a second opener fails while the first holds the directory; data survives a reopen', async ({ dir }) => {
  const store = await openEventStore({ dataDir: dir, purpose: 'svc serve' });
  const stream = uniqueStream();
  await store.append(stream, [event('Kept')], 'no_stream');
  try {
    await openEventStore({ dataDir: dir });
    assert.unreachable('the second open should fail');
  } catch (error) {
    assert.instance(error, DataDirLocked);
  }

  // Another process, as a CLI command would be.
  const script = join(dir, 'second-opener.mts');
  writeFileSync(
    script,
    `import { openEventStore } from ${JSON.stringify(storeModule)};
     try { await openEventStore({ dataDir: ${JSON.stringify(dir)} }); console.log('opened'); process.exit(0); }
     catch (error) { console.log(error.name + ': ' + error.message); process.exit(3); }`,
  );
  const child = await run(process.execPath, ['--import', 'tsx', script], { cwd: fileURLToPath(new URL('../..', import.meta.url)) }).catch((e) => e);
  assert.is(child.code, 3);
  assert.match(child.stdout, /DataDirLocked: the embedded store in .* is in use by another process \(pid \d+, svc serve, since /);
  assert.match(child.stdout, /stop that process first/);

  await store.close();
  assert.not.ok(existsSync(join(dir, 'store.lock')), 'the lock is released at close');
  const reopened = await openEventStore({ dataDir: dir });
  assert.equal((await reopened.readStream(stream)).events.map((e) => e.type), ['Kept']);
  await reopened.close();
});

it('a lock left by a process that died is taken over', async ({ dir }) => {
  writeFileSync(join(dir, 'store.lock'), JSON.stringify({ pid: 2 ** 22 + 12345, purpose: 'svc serve', since: new Date().toISOString() }));
  const store = await openEventStore({ dataDir: dir });
  await store.close();
});

it('openers racing for a stale lock: exactly one wins', async ({ dir }) => {
  const racer = join(dir, 'racer.mts');
  // Each racer loads, says so, waits for the instant it is given, tries once, reports, and keeps its lock until told to exit.
  writeFileSync(
    racer,
    `import { createInterface } from 'node:readline';
     import { acquireDataDirLock } from ${JSON.stringify(lockModule)};
     const lines = createInterface({ input: process.stdin });
     lines.once('line', (line) => {
       const startAt = Number(line);
       while (Date.now() < startAt) {}
       let verdict;
       try { acquireDataDirLock(${JSON.stringify(dir)}, 'racer'); verdict = 'won'; }
       catch (error) { verdict = error.name === 'DataDirLocked' ? 'locked' : 'error ' + error.message; }
       process.stdout.write(verdict + '\\n');
     });
     lines.once('close', () => process.exit(0));
     process.stdout.write('ready\\n');`,
  );
  const rounds = 6;
  const racers = 4;
  const outcomes: string[][] = [];
  for (let round = 0; round < rounds; round++) {
    // the lock of a process that died (a pid that cannot exist), on this host
    writeFileSync(join(dir, 'store.lock'), JSON.stringify({ pid: 2 ** 22 + 12345, host: hostname(), purpose: 'svc serve', since: new Date().toISOString() }));
    const children = Array.from({ length: racers }, () => spawn(process.execPath, ['--import', 'tsx', racer], { cwd: root, stdio: ['pipe', 'pipe', 'inherit'] }));
    // Each child's output lines in turn ('exited' once it has gone).
    const outputs = children.map((child) => {
      const lines: string[] = [];
      const waiting: ((line: string) => void)[] = [];
      const take = (line: string) => (waiting.length > 0 ? waiting.shift()!(line) : lines.push(line));
      createInterface({ input: child.stdout! }).on('line', take);
      child.on('close', () => {
        for (let i = 0; i < 2; i++) take('exited');
      });
      return () => new Promise<string>((resolve) => (lines.length > 0 ? resolve(lines.shift()!) : waiting.push(resolve)));
    });
    assert.equal(await Promise.all(outputs.map((next) => next())), Array(racers).fill('ready'));
    // Every racer has loaded: one instant, shortly after each is told it, for all of them.
    const startAt = Date.now() + 500;
    for (const child of children) child.stdin!.write(`${startAt}\n`);
    const verdicts = await Promise.all(outputs.map((next) => next()));
    await Promise.all(children.map((child) => new Promise((resolve) => (child.once('exit', resolve), child.stdin!.end()))));
    outcomes.push(verdicts.sort());
  }
  assert.equal(outcomes, Array.from({ length: rounds }, () => ['locked', 'locked', 'locked', 'won']));
  assert.not.ok(existsSync(join(dir, 'store.lock')), 'the winner released it at exit');
});

it('a lock refreshed from another host is respected; one not refreshed for the lease is taken over', async ({ dir }) => {
  const path = join(dir, 'store.lock');
  writeFileSync(path, JSON.stringify({ pid: process.pid, host: 'another-container', purpose: 'svc serve', since: new Date().toISOString() }));
  try {
    await openEventStore({ dataDir: dir });
    assert.unreachable('a fresh lock from another host holds');
  } catch (error) {
    assert.instance(error, DataDirLocked);
    assert.match((error as Error).message, /on another-container/);
  }
  const old = new Date(Date.now() - 120_000);
  utimesSync(path, old, old);
  const store = await openEventStore({ dataDir: dir });
  await store.close();
});

it.run();
