/**
 * A gateway killed in the middle of a harvest (SIGKILL: no drain, a shard half written) and started
 * again on the same data directory: its resumer finds the claim's lease lapsed, dispatches the job
 * again, and the new claim goes on from the first shard not recorded. Every shard is recorded once,
 * in order; the shards written before the crash are kept as they were (their files and hashes); what
 * the dead worker left half written is removed; the manifest lists every shard.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { startHarvestStack, crash, type HarvestStack } from '../support/harvest-stack.ts';
import { issueKey, json } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { harvestEvents, harvestStream } from '../../events/harvest.ts';
import { readSafetensors } from '../support/safetensors.ts';

const it = suite('a harvest resumed after its gateway was killed');
let stack: HarvestStack;

it.before(async () => {
  // A claim lease a starved process still renews in time (a third of it between renewals): the claims
  // counted below are the crash's, not a live worker's lease lapsing on a loaded machine.
  stack = await startHarvestStack({ name: 'harvest-resume', postgres: null, env: { SVC_HARVEST_LEASE_MS: '5000' } });
});
it.after(async () => {
  await stack?.stop();
});

it('resumes from the first shard not recorded, writes no shard twice and skips none', async () => {
  const first = await stack.serve();
  const key = await issueKey(first.url, stack.adminToken, { email: 'resume@example.org' });
  const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
  await stack.chaos({ mode: 'delay', count: 1_000_000, delay_ms: 250 });
  const prompts = Array.from({ length: 8 }, (_, i) => `prompt number ${i}`);
  const submitted = await fetch(`${first.url}/v1/harvest`, { method: 'POST', headers, body: JSON.stringify({ model: 'ref-byte', prompts, layers: [1, 3], shard_size: 1, batch_size: 1 }) });
  assert.is(submitted.status, 202);
  const id = (await json(submitted)).id as string;
  const before = await until('three shards written', async () => {
    const job = await json(await fetch(`${first.url}/v1/harvest/${id}?wait=5`, { headers }));
    return job.progress.shards_done >= 3 ? job : null;
  });
  assert.is(before.status, 'running');
  await crash(first.child);

  await stack.chaos({ mode: 'none' });
  const second = await stack.serve();
  const done = await until(
    'the job to finish on the restarted gateway',
    async () => {
      const job = await json(await fetch(`${second.url}/v1/harvest/${id}?wait=5`, { headers }));
      return job.status === 'running' || job.status === 'pending' ? null : job;
    },
    60_000,
  );
  assert.is(done.status, 'succeeded', JSON.stringify(done.error));
  assert.is(done.progress.shards_done, 8);
  const downloads = done.result.shards as { url: string; sha256: string; file: string }[];
  for (const shard of downloads) {
    const bytes = Buffer.from(await (await fetch(`${second.url}${shard.url}`, { headers })).arrayBuffer());
    assert.is(createHash('sha256').update(bytes).digest('hex'), shard.sha256);
  }
  // The statistics of the resumed job are those of the same harvest never interrupted, bit for bit.
  const again = await fetch(`${second.url}/v1/harvest`, { method: 'POST', headers, body: JSON.stringify({ model: 'ref-byte', prompts, layers: [1, 3], shard_size: 1, batch_size: 1 }) });
  const againId = (await json(again)).id as string;
  const uninterrupted = await until('the uninterrupted job to finish', async () => {
    const job = await json(await fetch(`${second.url}/v1/harvest/${againId}?wait=5`, { headers }));
    return job.status === 'running' || job.status === 'pending' ? null : job;
  }, 60_000);
  assert.is(uninterrupted.status, 'succeeded', JSON.stringify(uninterrupted.error));
  const statsOf = async (job: { result: { stats: { url: string } } }) => {
    const tensors = readSafetensors(Buffer.from(await (await fetch(`${second.url}${job.result.stats.url}`, { headers })).arrayBuffer())).tensors;
    return Object.fromEntries(Object.entries(tensors).map(([name, t]) => [name, [t.dtype, t.shape, Buffer.from(t.data).toString('hex')]]));
  };
  assert.equal(await statsOf(done), await statsOf(uninterrupted), 'stats.safetensors: the same tensors');
  assert.equal(done.result.manifest.stats.mean_token_norm, uninterrupted.result.manifest.stats.mean_token_norm);
  assert.is(done.result.manifest.stats.token_count, uninterrupted.result.manifest.stats.token_count);

  second.child.kill('SIGTERM');
  await new Promise((r) => second.child.once('exit', r));

  const store = await stack.openStore();
  const events = (await store.readStream(harvestStream(id))).events.map((e) => harvestEvents.parse(e));
  const written = events.filter((e) => e.type === 'HarvestShardWritten').map((e) => e.data as { shard: number; claim_id: string; file: string; sha256: string });
  assert.equal(
    written.map((s) => s.shard),
    [0, 1, 2, 3, 4, 5, 6, 7],
    'each shard recorded once, in order',
  );
  const claims = events.filter((e) => e.type === 'HarvestClaimed').map((e) => e.data as { claim_id: string; next_shard: number });
  assert.is(claims.length, 2, 'one claim before the crash, one after');
  assert.is(claims[0].next_shard, 0);
  assert.ok(claims[1].next_shard >= before.progress.shards_done, 'the new claim starts after what was recorded');
  assert.is(events.filter((e) => e.type === 'HarvestRedispatched').length, 1);
  for (const s of written) assert.is(s.claim_id, s.shard < claims[1].next_shard ? claims[0].claim_id : claims[1].claim_id);
  // The shards written before the crash are the ones served now, as recorded then.
  assert.equal(
    downloads.map((d) => [d.file, d.sha256]),
    written.map((s) => [s.file, s.sha256]),
  );
  // Left on disk: the recorded shards, the statistics and the manifest; the half-written shard, the
  // statistics checkpoints and the prompts are gone.
  const files = readdirSync(join(stack.harvestDir, id)).sort();
  assert.equal(files, [...written.map((s) => s.file), 'manifest.json', 'stats.safetensors'].sort());
  const manifest = JSON.parse(readFileSync(join(stack.harvestDir, id, 'manifest.json'), 'utf8'));
  assert.equal(
    manifest.shards.map((s: { file: string }) => s.file),
    written.map((s) => s.file),
  );
});

it.run();
