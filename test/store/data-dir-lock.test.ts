/** The embedded store belongs to one process: a second opener fails with a message that says so. */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { DataDirLocked, openEventStore } from '../../src/store/index.ts';
import { event, uniqueStream } from './adapters.ts';

const run = promisify(execFile);
const storeModule = fileURLToPath(new URL('../../src/store/index.ts', import.meta.url));

const it = suite<{ dir: string }>('embedded store data directory lock');
it.before((context) => {
  context.dir = mkdtempSync(join(tmpdir(), 'svc-store-lock-'));
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

it.run();
