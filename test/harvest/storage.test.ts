import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Buffer } from 'node:buffer';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileHarvestStorage, HarvestStorageError, shardFileName } from '../../src/harvest/storage.ts';
import { buildManifest } from '../../src/harvest/manifest.ts';

const root = mkdtempSync(join(tmpdir(), 'svc-harvest-storage-'));
const storage = fileHarvestStorage(root);
const sha256 = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');
const refused = (e: Error) => e instanceof HarvestStorageError;

/** Awaits `promise` and checks it rejects as `check` says (a pattern for the message, or a predicate). */
async function rejects(promise: Promise<unknown>, check: RegExp | ((e: Error) => boolean), message?: string): Promise<void> {
  let error: Error | null = null;
  try {
    await promise;
  } catch (err) {
    error = err as Error;
  }
  if (error === null) return assert.unreachable(`resolved; expected a rejection${message ? ` (${message})` : ''}`);
  assert.ok(check instanceof RegExp ? check.test(error.message) : check(error), `${error.message}${message ? ` (${message})` : ''}`);
}

test.after(() => rmSync(root, { recursive: true, force: true }));

test('the input: stored whole, readable by its owner only, hashed as stored, read back', async () => {
  const prompts = ['one', 'two\nlines "quoted"', 'ünïcödé 🦀', ''];
  const stored = await storage.saveInput('hj_input', prompts);
  const bytes = readFileSync(join(root, 'hj_input', 'input.json'));
  assert.equal(stored, { sha256: sha256(bytes), bytes: bytes.length });
  assert.is(statSync(join(root, 'hj_input', 'input.json')).mode & 0o777, 0o600);
  assert.is(statSync(join(root, 'hj_input')).mode & 0o777, 0o700);
  assert.equal(await storage.loadInput('hj_input'), prompts);
  assert.equal(await storage.listFiles('hj_input'), ['input.json'], 'no temporary file left');
  await rejects(storage.loadInput('hj_none'), /ENOENT/);
});

test('path traversal: job ids and file names that could leave the job folder are refused', async () => {
  for (const jobId of ['..', '.', '../hj_x', 'a/b', 'a\\b', '', '/etc', 'hj_x/..', 'hj x', '.hidden']) {
    await rejects(storage.saveInput(jobId, ['x']), refused, `job id ${JSON.stringify(jobId)}`);
    await rejects(storage.createShard(jobId, 'shard-00000-a.safetensors'), refused);
    await rejects(storage.readManifest(jobId), refused);
    await rejects(storage.removeJob(jobId), refused);
  }
  for (const file of ['../x.safetensors', '../../etc/passwd', 'a/b.safetensors', '.x.safetensors', '..', '', 'x.safetensors/']) {
    await rejects(storage.createShard('hj_paths', file), refused, `file ${JSON.stringify(file)}`);
    await rejects(storage.openShard('hj_paths', file), refused, `file ${JSON.stringify(file)}`);
  }
  await rejects(storage.createShard('hj_paths', 'manifest.json'), refused, 'a shard is *.safetensors');
  await rejects(storage.openShard('hj_paths', 'input.json'), refused, 'the prompts are never sent');
  assert.equal(await storage.listFiles('hj_paths'), []);
});

test('a shard: positional writes, invisible until commit, then whole under its name with the sha256 of its bytes', async () => {
  const sink = await storage.createShard('hj_shard', 'shard-00000-abc.safetensors');
  const header = Buffer.from('HEADER--');
  const data = [Buffer.from('0123456789'), Buffer.from('abcdef'), new Uint8Array(0), Buffer.from('XYZ')];
  await sink.write(8, data); // the data first, the header last, as the pipeline writes
  await sink.write(27, [Buffer.from('!')]);
  const during = await storage.listFiles('hj_shard');
  assert.is(during.length, 1);
  assert.ok(/^\.shard-00000-abc\.safetensors\.[0-9a-f]+\.partial$/.test(during[0]), during[0]);
  assert.is(await storage.openShard('hj_shard', 'shard-00000-abc.safetensors'), null, 'absent until committed');
  await sink.write(0, [header]);
  const stored = await sink.commit();
  const path = join(root, 'hj_shard', 'shard-00000-abc.safetensors');
  const bytes = readFileSync(path);
  assert.is(bytes.toString(), 'HEADER--0123456789abcdefXYZ!');
  assert.equal(stored, { sha256: sha256(bytes), bytes: 28 });
  assert.is(statSync(path).mode & 0o777, 0o600);
  assert.equal(await storage.listFiles('hj_shard'), ['shard-00000-abc.safetensors']);
  await rejects(sink.write(0, [header]), /already committed/);
  const opened = await storage.openShard('hj_shard', 'shard-00000-abc.safetensors');
  assert.is(opened!.size, 28);
  const chunks: Buffer[] = [];
  for await (const c of opened!.stream) chunks.push(c as Buffer);
  assert.equal(Buffer.concat(chunks), bytes);
});

test('a shard of several hash pieces (over 4 MiB) hashes to the sha256 of the file', async () => {
  const sink = await storage.createShard('hj_big', 'shard-00001-abc.safetensors');
  const big = Buffer.alloc(9 * 1024 * 1024 + 13);
  for (let i = 0; i < big.length; i += 4096) big.writeUInt32LE(i * 2654435761 >>> 0, i);
  await sink.write(64, [big.subarray(0, 5_000_000), big.subarray(5_000_000)]);
  await sink.write(0, [Buffer.alloc(64, 0x20)]);
  const stored = await sink.commit();
  const bytes = readFileSync(join(root, 'hj_big', 'shard-00001-abc.safetensors'));
  assert.is(bytes.length, big.length + 64);
  assert.equal(stored, { sha256: sha256(bytes), bytes: bytes.length });
});

test('a shard written with a gap is refused at commit and leaves nothing; abort leaves nothing', async () => {
  const gap = await storage.createShard('hj_gap', 'shard-00000-abc.safetensors');
  await gap.write(8, [Buffer.from('data')]);
  await rejects(gap.commit(), /gaps or overlaps/);
  await gap.abort();
  const overlap = await storage.createShard('hj_gap', 'shard-00001-abc.safetensors');
  await overlap.write(0, [Buffer.from('abcdef')]);
  await overlap.write(2, [Buffer.from('xy')]);
  await rejects(overlap.commit(), /gaps or overlaps/);
  await overlap.abort();
  const aborted = await storage.createShard('hj_gap', 'shard-00002-abc.safetensors');
  await aborted.write(0, [Buffer.from('abc')]);
  await aborted.abort();
  await aborted.abort();
  await rejects(aborted.commit(), /already aborted/);
  assert.equal(await storage.listFiles('hj_gap'), []);
});

test('the manifest: written whole, read back with the sha256 and size of its bytes; absent is null; not a manifest throws', async () => {
  assert.is(await storage.readManifest('hj_manifest'), null);
  const job = { job_id: 'hj_manifest', model: 'm', checkpoint: 'org/m', layers: [0, 3], d_model: 8 };
  const shards = [
    { shard: 0, file: shardFileName(0, 'cl_12345678abcdef'), first_prompt: 0, prompt_count: 2, token_count: 9, bytes: 400, sha256: 'a'.repeat(64) },
    { shard: 1, file: shardFileName(1, 'cl_12345678abcdef'), first_prompt: 2, prompt_count: 1, token_count: 4, bytes: 200, sha256: 'b'.repeat(64) },
  ];
  const manifest = buildManifest({ job, shards }, { createdAt: '2026-11-27T00:00:00.000Z' });
  assert.equal({ prompts: manifest.prompt_count, tokens: manifest.token_count, bytes: manifest.bytes }, { prompts: 3, tokens: 13, bytes: 600 });
  assert.is(manifest.shards[1].file, 'shard-00001-345678abcdef.safetensors');
  const written = await storage.writeManifest('hj_manifest', manifest);
  const bytes = readFileSync(join(root, 'hj_manifest', 'manifest.json'));
  assert.equal(written, { sha256: sha256(bytes), bytes: bytes.length });
  assert.equal(await storage.readManifest('hj_manifest'), { manifest, sha256: written.sha256, bytes: written.bytes });
  writeFileSync(join(root, 'hj_manifest', 'manifest.json'), '{"job_id":"x"}');
  await rejects(storage.readManifest('hj_manifest'), /does not hold a harvest manifest/);
  assert.throws(() => buildManifest({ job, shards: [shards[1]] }), /shards 0..0 in order/);
  assert.throws(() => buildManifest({ job, shards: [shards[0], { ...shards[1], first_prompt: 3 }] }), /starts at prompt 3/);
});

test('tidy keeps the named shards and the manifest; removes the input, other shards and temporary files', async () => {
  await storage.saveInput('hj_tidy', ['p']);
  for (const n of [0, 1]) {
    const sink = await storage.createShard('hj_tidy', `shard-0000${n}-keep.safetensors`);
    await sink.write(0, [Buffer.from('x')]);
    await sink.commit();
  }
  const zombie = await storage.createShard('hj_tidy', 'shard-00001-zombie.safetensors');
  await zombie.write(0, [Buffer.from('z')]);
  await zombie.commit();
  const crashed = await storage.createShard('hj_tidy', 'shard-00002-keep.safetensors');
  await crashed.write(0, [Buffer.from('partial')]); // a worker that died mid-shard
  await storage.writeManifest('hj_tidy', buildManifest({ job: { job_id: 'hj_tidy', model: 'm', checkpoint: 'c', layers: [0], d_model: null }, shards: [] }));
  const removed = await storage.tidy('hj_tidy', ['shard-00000-keep.safetensors', 'shard-00001-keep.safetensors']);
  assert.is(removed.length, 3);
  assert.ok(removed.includes('input.json') && removed.includes('shard-00001-zombie.safetensors'));
  assert.equal(await storage.listFiles('hj_tidy'), ['manifest.json', 'shard-00000-keep.safetensors', 'shard-00001-keep.safetensors']);
  await storage.removeJob('hj_tidy');
  assert.equal(await storage.listFiles('hj_tidy'), []);
  await storage.removeJob('hj_tidy');
});

test('shard names: five-digit shard number and the claim id’s last letters and digits', () => {
  assert.is(shardFileName(7, 'cl_0123456789abcdefXYZ'), 'shard-00007-789abcdefxyz.safetensors');
  assert.is(shardFileName(123456, 'a-b'), 'shard-123456-ab.safetensors');
  assert.throws(() => shardFileName(0, '---'), refused);
  assert.throws(() => shardFileName(-1, 'abc'), refused);
});

test.run();
