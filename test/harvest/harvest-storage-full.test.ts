/**
 * A full harvest volume, for real: SVC_HARVEST_DIR is a 2 MB tmpfs (mounted here; skipped, with the
 * reason, where mounting is not allowed). A job that fills it fails with `harvest_storage_full` and a
 * message that says what to do; its shards written so far stay downloadable; its owner's DELETE
 * removes its files (recorded, the space freed, the shards no longer served; a second DELETE changes
 * nothing), a succeeded job's DELETE is still 409; and a gateway whose retention is 0 hours removes a
 * failed job's files by itself, leaving a succeeded job's. On the embedded store and on PostgreSQL.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, statfsSync } from 'node:fs';
import { startHarvestStack, type HarvestStack } from '../support/harvest-stack.ts';
import { postgresUnavailable } from '../support/postgres.ts';
import { issueKey, json } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { harvestEvents, harvestStream } from '../../events/harvest.ts';
import type { ChildProcess } from 'node:child_process';

const databaseUrl = process.env.DATABASE_URL;
const pgUnavailable = await postgresUnavailable(databaseUrl);

/** Mounts a tmpfs of `size` at `dir`; the reason it cannot, or null. */
function mountTmpfs(dir: string, size: string): string | null {
  mkdirSync(dir, { recursive: true });
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${size},mode=0700`, 'tmpfs', dir], { stdio: 'pipe' });
    return null;
  } catch (error) {
    return `cannot mount a tmpfs (${String((error as { stderr?: Buffer }).stderr ?? (error as Error).message).trim()})`;
  }
}

const freeBytes = (dir: string) => {
  const s = statfsSync(dir);
  return s.bavail * s.bsize;
};

async function stopProcess(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const gone = new Promise((r) => child.once('exit', r));
  child.kill('SIGTERM');
  await gone;
}

function storageFullSuite(name: string, postgres: string | null) {
  const it = suite(`a full harvest volume (${name})`);
  let stack: HarvestStack;
  let mounted = false;
  let skip: string | null = null;

  it.before(async () => {
    stack = await startHarvestStack({ name: `harvest-full-${name}`, postgres, env: { SVC_HARVEST_LEASE_MS: '3000' } });
    skip = mountTmpfs(stack.harvestDir, '2m');
    mounted = skip === null;
  });
  it.after(async () => {
    if (mounted) execFileSync('umount', ['-l', stack.harvestDir]);
    await stack?.stop();
  });

  it('fails as harvest_storage_full; DELETE removes its files; the retention removes another\'s by itself', async () => {
    if (skip) {
      console.log(`  skipped: ${skip}`);
      return;
    }
    let gateway = await stack.serve();
    const key = await issueKey(gateway.url, stack.adminToken, { email: `full-${name}@example.org` });
    const headers = { authorization: `Bearer ${key}` };
    const submit = (body: unknown) => fetch(`${gateway.url}/v1/harvest`, { method: 'POST', headers: { ...headers, 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const read = (id: string) => fetch(`${gateway.url}/v1/harvest/${id}`, { headers });
    const ended = (id: string) =>
      until(`job ${id} to end`, async () => {
        const job = await json(await fetch(`${gateway.url}/v1/harvest/${id}?wait=10`, { headers }));
        return ['succeeded', 'failed', 'cancelled'].includes(job.status) ? job : null;
      }, 120_000);
    // 8 shards of one 1,000-character prompt: 4 layers × 1,001 tokens × 64 × 2 bytes, about 0.5 MB each.
    const filling = { model: 'ref-byte', prompts: Array.from({ length: 8 }, (_, i) => `${i}`.padEnd(1000, 'x')), shard_size: 1, batch_size: 1 };

    // A small job that succeeds first, its files kept whatever happens to the failed ones.
    const small = await json(await submit({ model: 'ref-byte', prompts: ['kept'] }));
    assert.is((await ended(small.id)).status, 'succeeded');

    const full = await json(await submit(filling));
    const failed = await ended(full.id);
    assert.is(failed.status, 'failed', JSON.stringify(failed));
    assert.is(failed.error.code, 'harvest_storage_full');
    assert.match(failed.error.message, /^the harvest storage is full: the job stopped after \d+ shard\(s\), which stay downloadable\. DELETE \/v1\/harvest\/hj_\w+ removes this job's files/);
    assert.not.match(failed.error.message, /internal error/);
    assert.ok(failed.progress.shards_done >= 1 && failed.progress.shards_done < 8, `${failed.progress.shards_done} shards`);
    assert.is(failed.files_removed_at, null);
    const shard0 = await fetch(`${gateway.url}/v1/harvest/${full.id}/shards/0`, { headers });
    assert.is(shard0.status, 200);
    await shard0.arrayBuffer();
    const freeWhenFull = freeBytes(stack.harvestDir);

    // The owner's DELETE removes the failed job's files and frees the space; the record stays.
    const deleted = await fetch(`${gateway.url}/v1/harvest/${full.id}`, { method: 'DELETE', headers });
    const deletedBody = await json(deleted);
    assert.is(deleted.status, 200, JSON.stringify(deletedBody));
    assert.is(deletedBody.status, 'failed');
    assert.is(deletedBody.error.code, 'harvest_storage_full');
    assert.type(deletedBody.files_removed_at, 'string');
    assert.not.ok(existsSync(`${stack.harvestDir}/${full.id}`));
    assert.ok(freeBytes(stack.harvestDir) > freeWhenFull + 400_000, 'the space is freed');
    const gone = await fetch(`${gateway.url}/v1/harvest/${full.id}/shards/0`, { headers });
    assert.is(gone.status, 404);
    assert.is((await json(gone)).error.code, 'harvest_shard_not_found');
    const again = await fetch(`${gateway.url}/v1/harvest/${full.id}`, { method: 'DELETE', headers });
    assert.is(again.status, 200);
    assert.is((await json(again)).files_removed_at, deletedBody.files_removed_at);
    assert.is((await json(await read(full.id))).files_removed_at, deletedBody.files_removed_at);

    // A succeeded job is not deleted.
    const refused = await fetch(`${gateway.url}/v1/harvest/${small.id}`, { method: 'DELETE', headers });
    assert.is(refused.status, 409);
    assert.is((await json(refused)).error.code, 'harvest_not_cancellable');

    // Another job fills the volume and fails; a gateway with a retention of 0 hours removes its files itself.
    const second = await json(await submit(filling));
    assert.is((await ended(second.id)).error.code, 'harvest_storage_full');
    assert.ok(existsSync(`${stack.harvestDir}/${second.id}`));
    await stopProcess(gateway.child);
    gateway = await stack.serve({ SVC_HARVEST_FAILED_RETENTION_HOURS: '0' });
    await until(`the files of ${second.id} to be removed`, async () => !existsSync(`${stack.harvestDir}/${second.id}`), 60_000);
    const aged = await until('the removal to be recorded', async () => {
      const job = await json(await read(second.id));
      return job.files_removed_at ? job : null;
    });
    assert.is(aged.status, 'failed');
    assert.ok(existsSync(`${stack.harvestDir}/${small.id}`), "a succeeded job's files are kept");
    await stopProcess(gateway.child);

    // What the log says: one removal each, by the owner and by the retention.
    const store = await stack.openStore();
    const removals = [];
    for (const id of [full.id, second.id]) {
      for (const event of (await store.readStream(harvestStream(id))).events) {
        const e = harvestEvents.parse(event);
        if (e.type === 'HarvestFilesRemoved') removals.push({ id, reason: e.data.reason, by: e.data.by_key_prefix });
      }
    }
    assert.is(removals.length, 2, JSON.stringify(removals));
    assert.is(removals[0].id, full.id);
    assert.is(removals[0].reason, 'owner');
    assert.ok(typeof removals[0].by === 'string' && key.includes(removals[0].by), 'the key that deleted them');
    assert.equal(removals[1], { id: second.id, reason: 'retention', by: null });
  });

  return it;
}

storageFullSuite('pglite', null).run();
if (pgUnavailable) {
  const skipped = suite('a full harvest volume (postgresql)');
  skipped.skip(`on PostgreSQL: ${pgUnavailable}`, () => {});
  skipped.run();
} else storageFullSuite('postgresql', databaseUrl!).run();
