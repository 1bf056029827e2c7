/**
 * A harvest's statistics (stats.safetensors and the manifest's mean token norms), computed while the
 * shards are written: checked against a plain float64 two-pass computation over the shards read back,
 * the same bits whatever the shard and batch sizes, and the same bits for a job stopped after a shard
 * and resumed (from its checkpoint, or, without one, from the shard files).
 */
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Buffer } from 'node:buffer';
import { mkdtempSync, readFileSync, rmSync, unlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileHarvestStorage, shardFileName } from '../../src/harvest/storage.ts';
import { runShardPipeline, type CapturedPrompt, type ShardPipelineDeps } from '../../src/harvest/shard-pipeline.ts';
import type { HarvestShard } from '../../events/harvest.ts';
import { RunningStats, checkpointFileOf, resumeStats, writeStatsFile } from '../../src/harvest/stats.ts';
import { fixedMemory, jsRowsKernel, wasmRowsKernel } from '../../src/harvest/stats-kernel.ts';
import { kernelMemoryOf } from '../../src/harvest/stats-memory.ts';
import { CaptureBuffers } from '../../src/harvest/capture-decode.ts';

const root = mkdtempSync(join(tmpdir(), 'svc-harvest-stats-'));
const storage = fileHarvestStorage(root);
test.after(() => rmSync(root, { recursive: true, force: true }));

const LAYERS = [1, 5, 6];
const PROMPTS = 23;

/** A small generator (deterministic) and a normal sample from it. */
function rng(seed: number) {
  let s = seed >>> 0;
  const next = () => {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    return (s + 0.5) / 2 ** 32;
  };
  return { next, normal: () => Math.sqrt(-2 * Math.log(next())) * Math.cos(2 * Math.PI * next()) };
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);
const toBf16 = (x: number) => {
  f32[0] = x;
  const w = u32[0];
  return (w + 0x7fff + ((w >>> 16) & 1)) >>> 16;
};
const fromBf16 = (h: number) => {
  u32[0] = h << 16;
  return f32[0];
};

/**
 * Residual-stream-like captures: per layer and dimension an offset (a few "massive" dimensions far from
 * zero), a scale that grows with depth, per-token loudness, heavy-ish tails; position 0 (BOS) huge.
 */
function makeCaptures(dModel: number, seed = 7): CapturedPrompt[] {
  const g = rng(seed);
  const offset = LAYERS.map(() => Array.from({ length: dModel }, (_, d) => (d % 17 === 3 ? 400 + 100 * g.next() : g.normal() * 2)));
  const scale = LAYERS.map((_, l) => Array.from({ length: dModel }, () => (0.5 + g.next()) * (1 + l)));
  return Array.from({ length: PROMPTS }, (_, i) => {
    const tokens = i % 9 === 4 ? 1 : 2 + ((i * 7) % 40); // some one-token prompts: nothing counted
    const values = new Uint16Array(LAYERS.length * tokens * dModel);
    for (let l = 0; l < LAYERS.length; l++) {
      for (let t = 0; t < tokens; t++) {
        const loud = t === 0 ? 50 : 1 + 0.3 * g.normal() ** 2;
        for (let d = 0; d < dModel; d++) values[(l * tokens + t) * dModel + d] = toBf16((t === 0 ? 3000 : offset[l][d]) + scale[l][d] * loud * g.normal());
      }
    }
    return { tokens: Int32Array.from({ length: tokens }, (_, k) => 100 + k), shape: [LAYERS.length, tokens, dModel] as const, bytes: new Uint8Array(values.buffer) };
  });
}

async function harvest(jobId: string, captures: CapturedPrompt[], shardSize: number, batchSize: number, extra: Partial<ShardPipelineDeps> = {}, startShard = 0) {
  const records: HarvestShard[] = [];
  const ran = await runShardPipeline(
    { jobId, checkpoint: 'org/m', layers: LAYERS, dModel: captures[0].shape[2], promptCount: captures.length, shardSize, batchSize, startShard },
    {
      storage,
      fileNameFor: (shard) => shardFileName(shard, `claim-${jobId}-${startShard}`),
      captureBatch: async (first, count) => captures.slice(first, first + count).map((c) => ({ ...c, bytes: c.bytes.slice() })),
      onShardWritten: async (record) => void records.push(record),
      ...extra,
    },
  );
  return { records, ran };
}

/** stats.safetensors read with a reader of its own: the tensors' dtypes, shapes and values. */
function readStats(file: Buffer) {
  const length = Number(file.readBigUInt64LE(0));
  const header = JSON.parse(file.subarray(8, 8 + length).toString('utf8'));
  const data = file.subarray(8 + length);
  const tensor = (name: string) => {
    const { dtype, shape, data_offsets: [b, e] } = header[name];
    return { dtype, shape, bytes: Buffer.from(data.subarray(b, e)) };
  };
  const t = Object.fromEntries(['mean', 'std', 'mean_norm', 'layer_indices', 'token_count'].map((n) => [n, tensor(n)]));
  return { metadata: header.__metadata__ as Record<string, string>, t };
}

/** The plain computation: every shard read back, every counted token in float64, the mean first, then the deviations. */
function straightforward(jobId: string, records: HarvestShard[], dModel: number) {
  const L = LAYERS.length;
  const rows: Float64Array[][] = LAYERS.map(() => []);
  for (const r of records) {
    const file = readFileSync(join(root, jobId, r.file));
    const length = Number(file.readBigUInt64LE(0));
    const header = JSON.parse(file.subarray(8, 8 + length).toString('utf8'));
    for (let i = r.first_prompt; i < r.first_prompt + r.prompt_count; i++) {
      const { shape: [, tokens], data_offsets: [b] } = header[`prompt_${i}`];
      for (let l = 0; l < L; l++) {
        for (let t = 1; t < tokens; t++) {
          const row = new Float64Array(dModel);
          for (let d = 0; d < dModel; d++) row[d] = fromBf16(file.readUInt16LE(8 + length + b + ((l * tokens + t) * dModel + d) * 2));
          rows[l].push(row);
        }
      }
    }
  }
  const n = rows[0].length;
  const mean = rows.map((rs) => Array.from({ length: dModel }, (_, d) => rs.reduce((s, r) => s + r[d], 0) / n));
  const std = rows.map((rs, l) => Array.from({ length: dModel }, (_, d) => Math.sqrt(rs.reduce((s, r) => s + (r[d] - mean[l][d]) ** 2, 0) / n)));
  const norm = rows.map((rs) => rs.reduce((s, r) => s + Math.sqrt(r.reduce((q, x) => q + x * x, 0)), 0) / n);
  return { n, mean, std, norm };
}

test('the WebAssembly kernel and the JavaScript loop give the same bits', () => {
  const width = 24;
  const rows = 37;
  const w = wasmRowsKernel(fixedMemory(4));
  assert.ok(w, 'WebAssembly SIMD is available on this Node');
  const j = jsRowsKernel(fixedMemory(4));
  const state = 8192;
  for (const k of [w!, j]) {
    const bits = new Uint16Array(k.memory.buffer, 0, rows * width);
    const st = new Float64Array(k.memory.buffer, state, (width / 4) * 12);
    const g = rng(11);
    for (let i = 0; i < bits.length; i++) bits[i] = toBf16(g.normal() * 10 + (i % width === 5 ? 1e4 : 0));
    for (let d = 0; d < width; d++) st[(d >> 2) * 12 + (d & 3)] = d === 5 ? 1e4 : 0.5;
  }
  const nw = w!.accumulate(0, rows, width, state, 1.5);
  const nj = j.accumulate(0, rows, width, state, 1.5);
  assert.is(nw, nj);
  const sums = [...new Float64Array(w!.memory.buffer, state, (width / 4) * 12)];
  assert.equal(sums, [...new Float64Array(j.memory.buffer, state, (width / 4) * 12)]);
  assert.ok(sums.some((x, i) => i % 12 >= 4 && x !== 0), 'the sums moved');
});

test('RunningStats gives the same bits through either kernel', () => {
  const captures = makeCaptures(10, 9);
  const [w, j] = [new RunningStats(LAYERS, 10), new RunningStats(LAYERS, 10, { kernel: 'js' })];
  for (const c of captures) for (const s of [w, j]) s.add(c.bytes, c.shape);
  assert.ok(w.encodeFile('hj').equals(j.encodeFile('hj')));
  assert.ok(w.encodeCheckpoint({ jobId: 'hj', shard: 0, shardSha256: '0'.repeat(64) }).equals(j.encodeCheckpoint({ jobId: 'hj', shard: 0, shardSha256: '0'.repeat(64) })));
});

for (const dModel of [64, 10]) {
  test(`d_model ${dModel}: stats.safetensors matches a plain float64 computation over the shards`, async () => {
    const captures = makeCaptures(dModel);
    const jobId = `hj_plain_${dModel}`;
    const { records, ran } = await harvest(jobId, captures, 5, 3);
    const summary = await writeStatsFile(storage, jobId, ran.stats);
    const file = readFileSync(join(root, jobId, 'stats.safetensors'));
    assert.is(summary!.bytes, file.length);
    const { metadata, t } = readStats(file);
    const plain = straightforward(jobId, records, dModel);
    const expectedTokens = captures.reduce((s, c) => s + c.shape[1] - 1, 0);
    assert.is(plain.n, expectedTokens);
    assert.is(summary!.token_count, expectedTokens);
    assert.is(metadata.token_count, String(expectedTokens));
    assert.is(new BigInt64Array(Uint8Array.from(t.token_count.bytes).buffer)[0], BigInt(expectedTokens));
    assert.equal([t.mean.dtype, t.mean.shape, t.std.dtype, t.std.shape], ['F32', [3, dModel], 'F32', [3, dModel]]);
    assert.equal([t.layer_indices.dtype, [...new Int32Array(Uint8Array.from(t.layer_indices.bytes).buffer)]], ['I32', LAYERS]);
    const mean = new Float32Array(Uint8Array.from(t.mean.bytes).buffer);
    const std = new Float32Array(Uint8Array.from(t.std.bytes).buffer);
    let worst = 0;
    for (let l = 0; l < LAYERS.length; l++) {
      for (let d = 0; d < dModel; d++) {
        const m = plain.mean[l][d];
        const s = plain.std[l][d];
        // float32 holds the result: its rounding (6e-8) is most of what is left
        worst = Math.max(worst, Math.abs(mean[l * dModel + d] - m) / Math.max(Math.abs(m), s), Math.abs(std[l * dModel + d] - s) / s);
      }
      const norm = summary!.mean_token_norm[l]!;
      worst = Math.max(worst, Math.abs(norm - plain.norm[l]) / plain.norm[l]);
      assert.is(new Float64Array(Uint8Array.from(t.mean_norm.bytes).buffer)[l], norm);
    }
    assert.ok(worst < 1e-6, `relative error ${worst}`);
  });
}

test('the same numbers whatever the shard size and the batch size', async () => {
  const captures = makeCaptures(64, 21);
  let reference: Buffer | null = null;
  for (const [shardSize, batchSize] of [[1, 1], [4, 3], [7, 7], [23, 2], [64, 64]]) {
    const jobId = `hj_sizes_${shardSize}_${batchSize}`;
    const { ran } = await harvest(jobId, captures, shardSize, batchSize);
    await writeStatsFile(storage, jobId, ran.stats);
    const { t } = readStats(readFileSync(join(root, jobId, 'stats.safetensors')));
    const data = Buffer.concat(Object.values(t).map((x) => x.bytes));
    if (reference === null) reference = data;
    else assert.ok(data.equals(reference), `shards of ${shardSize}, batches of ${batchSize}: the same bytes`);
  }
});

test('a job stopped after a shard and resumed ends with the same bits, from its checkpoint or from its shards', async () => {
  const captures = makeCaptures(64, 5);
  const whole = await harvest('hj_whole_run', captures, 4, 3);
  const expected = whole.ran.stats!.encodeFile('hj_whole_run');
  const tensorsOf = (file: Buffer) => Buffer.concat(Object.values(readStats(file).t).map((x) => x.bytes));

  for (const lose of ['nothing', 'checkpoint', 'stale checkpoint']) {
    const jobId = `hj_stopped_${lose.replace(' ', '_')}`;
    const recorded: HarvestShard[] = [];
    const stop = new Error('killed');
    let older: Buffer | null = null;
    const first = await harvest(jobId, captures, 4, 3, {
      onShardWritten: async (r) => {
        if (r.shard === 1) older = readFileSync(join(root, jobId, checkpointFileOf(r.file)));
        if (r.shard === 3) throw stop; // written, never recorded: the next claim writes it again
        recorded.push({ shard: r.shard, file: r.file, first_prompt: r.first_prompt, prompt_count: r.prompt_count, token_count: r.token_count, bytes: r.bytes, sha256: r.sha256 });
      },
    }).catch((err) => err);
    assert.is(first, stop);
    assert.is(recorded.length, 3);
    const checkpoint = checkpointFileOf(recorded[2].file);
    if (lose === 'checkpoint') unlinkSync(join(root, jobId, checkpoint));
    if (lose === 'stale checkpoint') {
      // the checkpoint of shard 1 put in shard 2's place: refused (another shard), the sums are recomputed
      await storage.writeFile(jobId, checkpoint, older!);
    }
    const resumed = await resumeStats(storage, jobId, recorded, LAYERS);
    assert.is(resumed!.prompts, 12);
    assert.is(resumed!.checkpointFile, lose === 'nothing' ? checkpoint : null, 'the checkpoint is used only when it is that shard’s');
    const rest = await harvest(jobId, captures, 4, 3, { stats: resumed }, 3);
    assert.equal(rest.records.map((r) => r.shard), [3, 4, 5]);
    assert.ok(tensorsOf(rest.ran.stats!.encodeFile(jobId)).equals(tensorsOf(expected)), `${lose} lost: the same statistics as the run never stopped`);
    assert.equal(rest.ran.stats!.meanTokenNorms(), whole.ran.stats!.meanTokenNorms());
  }
});

test('captures in kernel memory are summed where they lie: the same bits across buffer reuse, a larger memory, a full one', () => {
  const captures = makeCaptures(64, 13);
  const plain = new RunningStats(LAYERS, 64);
  for (const c of captures) plain.add(c.bytes, c.shape);
  const checkpoint = (s: RunningStats) => s.encodeCheckpoint({ jobId: 'hj', shard: 0, shardSha256: '0'.repeat(64) });
  for (const kernel of ['wasm', 'js'] as const) {
    // keep 1: a kernel memory of three 1 MiB buffers; the stats' own region takes part of one
    const buffers = new CaptureBuffers({ minBytes: 0, keep: 1 });
    const stats = new RunningStats(LAYERS, 64, { kernel });
    const held: Buffer[] = [];
    const where = new Set<unknown>();
    captures.forEach((c, i) => {
      // prompt 9 far larger (a new kernel memory, 9 MiB); prompts from 12 on held back (that memory full: buffers of their own)
      const bytes = buffers.take(i === 9 ? 3 << 20 : c.bytes.byteLength).subarray(0, c.bytes.byteLength);
      bytes.set(c.bytes);
      where.add(kernelMemoryOf(bytes) ?? 'own');
      stats.add(bytes, c.shape);
      if (i >= 12) held.push(bytes);
      else buffers.give(bytes);
    });
    assert.is(where.size, 3, `${kernel}: buffers in two kernel memories and one of its own`);
    assert.ok(held.every((b, k) => b.equals(captures[12 + k].bytes)), 'the buffers held are intact');
    assert.ok(stats.encodeFile('hj').equals(plain.encodeFile('hj')), `${kernel}: the same statistics as copies summed`);
    assert.ok(checkpoint(stats).equals(checkpoint(plain)));
  }
});

test('without a counted token (every prompt one token long) the statistics say so', async () => {
  const stats = new RunningStats(LAYERS, 8);
  stats.add(new Uint8Array(3 * 1 * 8 * 2), [3, 1, 8]);
  assert.is(stats.tokens, 0);
  assert.equal(stats.meanTokenNorms(), [null, null, null]);
  assert.ok(Number.isNaN(stats.result().mean[0]));
});

test.run();
