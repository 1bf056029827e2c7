import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Buffer } from 'node:buffer';
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { encodeTensor } from '../../src/codec/index.ts';
import { CaptureBuffers, decodeCapture } from '../../src/harvest/capture-decode.ts';
import { fileHarvestStorage, shardFileName, type HarvestStorage } from '../../src/harvest/storage.ts';
import { checkpointFileOf } from '../../src/harvest/stats.ts';
import { captureOffsets, runShardPipeline, type BatchPlace, type CapturedPrompt, type ShardPipelineDeps, type ShardPlan } from '../../src/harvest/shard-pipeline.ts';
import type { HarvestShard } from '../../events/harvest.ts';

const root = mkdtempSync(join(tmpdir(), 'svc-harvest-pipeline-'));
const storage = fileHarvestStorage(root);
test.after(() => rmSync(root, { recursive: true, force: true }));

const LAYERS = [0, 4, 9];
const D_MODEL = 8;
const CLAIM = 'cl_0123456789abcdef';
const sha256 = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');
const tick = () => new Promise((r) => setImmediate(r));

// Prompt i: 1 to 7 tokens (ids i*1000 + k), values that differ per prompt, sent as bf16 or (every third) float32.
const tokenCount = (i: number) => 1 + ((i * 5) % 7);
const tokenIds = (i: number) => Int32Array.from({ length: tokenCount(i) }, (_, k) => i * 1000 + k);
const valuesOf = (i: number) => Array.from({ length: LAYERS.length * tokenCount(i) * D_MODEL }, (_, k) => (((i * 131 + k * 7) % 1000) - 500) / 64);
const shapeOf = (i: number) => [LAYERS.length, tokenCount(i), D_MODEL];
/** The bf16 bytes a shard must hold for prompt i. */
const bf16Of = (i: number) => Buffer.from(encodeTensor(valuesOf(i), shapeOf(i), 'bfloat16').data, 'base64');

function captureBody(i: number): Buffer {
  const codec = encodeTensor(valuesOf(i), shapeOf(i), i % 3 === 2 ? 'float32' : 'bfloat16');
  return Buffer.from(`{"id":"cmpl-${i}","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":"length"}],"usage":{"prompt_tokens":${tokenCount(i)}},"activations":{"residual_stream":${JSON.stringify(codec)}}}`);
}

function captured(i: number, buffers?: CaptureBuffers, phase?: number): CapturedPrompt {
  const { shape, bytes } = decodeCapture(captureBody(i), { layers: LAYERS.length, dModel: D_MODEL }, buffers, phase);
  return { tokens: tokenIds(i), shape, bytes };
}

const plan = (jobId: string, overrides: Partial<ShardPlan> = {}): ShardPlan => ({
  jobId,
  checkpoint: 'org/model-3l',
  layers: LAYERS,
  dModel: D_MODEL,
  promptCount: 7,
  shardSize: 3,
  batchSize: 2,
  startShard: 0,
  ...overrides,
});

/** Everything the pipeline did, in order: captures asked and answered, shard writes and commits, records. */
function recorder(inner: HarvestStorage = storage) {
  const events: string[] = [];
  const records: HarvestShard[] = [];
  let inFlight = 0;
  let mostInFlight = 0;
  const observed: HarvestStorage = {
    ...inner,
    async createShard(jobId, file) {
      events.push(`create:${file.slice(6, 11)}`);
      const sink = await inner.createShard(jobId, file);
      return {
        file: sink.file,
        write: async (position, chunks) => {
          events.push(position === 0 ? 'write:header' : 'write');
          await sink.write(position, chunks);
        },
        commit: async () => {
          const stored = await sink.commit();
          events.push(`commit:${file.slice(6, 11)}`);
          return stored;
        },
        abort: () => sink.abort(),
      };
    },
  };
  const deps: ShardPipelineDeps = {
    storage: observed,
    fileNameFor: (shard) => shardFileName(shard, CLAIM),
    async captureBatch(first, count) {
      events.push(`capture:${first}+${count}`);
      inFlight += count;
      mostInFlight = Math.max(mostInFlight, inFlight);
      await tick();
      inFlight -= count;
      return Array.from({ length: count }, (_, k) => captured(first + k));
    },
    async onShardWritten(record) {
      events.push(`recorded:${record.shard}`);
      records.push(record);
    },
  };
  return { events, records, deps, mostInFlight: () => mostInFlight };
}

/**
 * An independent safetensors reader, from the format's description: the 8-byte LE header length, the JSON
 * header (spaces after it only), string metadata, tensors whose offsets tile the data section exactly.
 */
function readSafetensors(file: Buffer): { metadata: Record<string, string>; tensors: Map<string, { dtype: string; shape: number[]; bytes: Buffer }> } {
  const length = Number(file.readBigUInt64LE(0));
  assert.is(length % 8, 0, 'header length is a multiple of 8');
  const text = file.subarray(8, 8 + length).toString('utf8');
  assert.ok(/^\{.*\} *$/s.test(text), 'the header is JSON padded with spaces');
  const { __metadata__: metadata, ...entries } = JSON.parse(text) as Record<string, any>;
  for (const value of Object.values(metadata)) assert.type(value, 'string', 'metadata values are strings');
  const data = file.subarray(8 + length);
  const sizes: Record<string, number> = { BF16: 2, I32: 4, F32: 4 };
  const byOffset = Object.entries(entries).sort((a, b) => a[1].data_offsets[0] - b[1].data_offsets[0]);
  let at = 0;
  const tensors = new Map<string, { dtype: string; shape: number[]; bytes: Buffer }>();
  for (const [name, { dtype, shape, data_offsets: [begin, end] }] of byOffset) {
    assert.is(begin, at, `${name} starts where the previous tensor ends`);
    assert.is(end - begin, sizes[dtype] * shape.reduce((n: number, d: number) => n * d, 1), `${name}'s bytes are dtype × shape`);
    tensors.set(name, { dtype, shape, bytes: data.subarray(begin, end) });
    at = end;
  }
  assert.is(at, data.length, 'the tensors cover the data section to its end');
  return { metadata, tensors };
}

function checkShard(jobId: string, record: HarvestShard): void {
  const bytes = readFileSync(join(root, jobId, record.file));
  assert.is(record.sha256, sha256(bytes), 'the recorded hash is the sha256 of the file');
  assert.is(record.bytes, bytes.length);
  const { metadata, tensors } = readSafetensors(bytes);
  assert.equal(metadata, { job_id: jobId, checkpoint: 'org/model-3l', layers: '[0,4,9]' });
  const names: string[] = [];
  let tokens = 0;
  for (let i = record.first_prompt; i < record.first_prompt + record.prompt_count; i++) {
    names.push(`prompt_${i}`, `tokens_${i}`);
    const prompt = tensors.get(`prompt_${i}`)!;
    assert.equal({ dtype: prompt.dtype, shape: prompt.shape }, { dtype: 'BF16', shape: shapeOf(i) });
    assert.ok(prompt.bytes.equals(bf16Of(i)), `prompt_${i}'s bytes`);
    const ids = tensors.get(`tokens_${i}`)!;
    assert.equal({ dtype: ids.dtype, shape: ids.shape }, { dtype: 'I32', shape: [tokenCount(i)] });
    assert.equal([...new Int32Array(Uint8Array.from(ids.bytes).buffer)], [...tokenIds(i)], `tokens_${i}`);
    tokens += tokenCount(i);
  }
  assert.equal([...tensors.keys()].sort(), names.sort(), 'exactly the shard’s prompts, by their index in the job');
  assert.is(record.token_count, tokens);
}

async function rejection(promise: Promise<unknown>): Promise<Error> {
  try {
    await promise;
  } catch (err) {
    return err as Error;
  }
  throw new Error('resolved; expected a rejection');
}

test('7 prompts in shards of 3, batches of 2: three safetensors files, each read back whole and hashed', async () => {
  const { events, records, deps } = recorder();
  const result = await runShardPipeline(plan('hj_whole'), deps);
  assert.equal({ shardsWritten: result.shardsWritten, dModel: result.dModel, prompts: result.stats?.prompts }, { shardsWritten: 3, dModel: D_MODEL, prompts: 7 });
  assert.equal(
    records.map((r) => [r.shard, r.first_prompt, r.prompt_count, r.file]),
    [
      [0, 0, 3, 'shard-00000-456789abcdef.safetensors'],
      [1, 3, 3, shardFileName(1, CLAIM)],
      [2, 6, 1, shardFileName(2, CLAIM)],
    ],
  );
  for (const record of records) checkShard('hj_whole', record);
  assert.equal(events.filter((e) => e.startsWith('capture')), ['capture:0+2', 'capture:2+1', 'capture:3+2', 'capture:5+1', 'capture:6+1'], 'batches never cross a shard');
  assert.equal(await storage.listFiles('hj_whole'), [...records.map((r) => r.file), checkpointFileOf(records[2].file)].sort(), "no temporary file left; only the last shard's statistics checkpoint");
});

test('the next batch is captured while this one is written; a shard is recorded before the next is written', async () => {
  const { events, deps, mostInFlight } = recorder();
  const at = (e: string) => {
    const i = events.indexOf(e);
    assert.ok(i >= 0, `${e} happened`);
    return i;
  };
  await runShardPipeline(plan('hj_overlap'), deps);
  assert.ok(at('capture:2+1') < events.indexOf('write'), 'batch 2 asked before batch 1 is written');
  assert.ok(at('capture:3+2') < at('commit:00000'), "the next shard's first batch is asked before this shard's commit");
  assert.ok(at('recorded:0') < at('create:00001'), 'shard 1 is not started before shard 0 is recorded');
  assert.ok(at('recorded:1') < at('create:00002'));
  assert.ok(events.lastIndexOf('write:header') < at('commit:00002'));
  assert.ok(mostInFlight() <= 2, `at most batch_size prompts in flight (${mostInFlight()})`);
});

test('a resumed claim starts at its next shard and writes only the shards left', async () => {
  const { events, records, deps } = recorder();
  const result = await runShardPipeline(plan('hj_resume', { startShard: 1 }), deps);
  assert.is(result.shardsWritten, 2);
  assert.equal(records.map((r) => r.shard), [1, 2]);
  assert.is(events.find((e) => e.startsWith('capture')), 'capture:3+2');
  for (const record of records) checkShard('hj_resume', record);
  assert.equal(await runShardPipeline(plan('hj_resume', { startShard: 3 }), deps), { shardsWritten: 0, dModel: D_MODEL, stats: null }, 'nothing left to write');
});

test('an abort stops a capture that hangs at once, and leaves no temporary file', async () => {
  const { deps } = recorder();
  const controller = new AbortController();
  let hungSignal: AbortSignal | null = null;
  const started = performance.now();
  const error = await rejection(
    runShardPipeline(plan('hj_abort'), {
      ...deps,
      signal: controller.signal,
      captureBatch: async (first, count, signal) => {
        if (first < 2) return deps.captureBatch(first, count, signal);
        hungSignal = signal;
        setTimeout(() => controller.abort(new Error('job cancelled')), 20);
        return new Promise<CapturedPrompt[]>(() => {}); // an engine that never answers, and ignores the signal
      },
    }),
  );
  assert.is(error.message, 'job cancelled');
  assert.ok(performance.now() - started < 30_000, 'promptly, not waiting on the engine that never answers');
  assert.ok(hungSignal!.aborted, 'the capture in flight was told to stop');
  assert.equal(await storage.listFiles('hj_abort'), [], 'the shard being written is removed');
});

test('a capture error propagates as is; shards already recorded stay, the one in progress is removed', async () => {
  const { records, deps } = recorder();
  const engineDown = new Error('engine down');
  const error = await rejection(
    runShardPipeline(plan('hj_capture_error'), {
      ...deps,
      captureBatch: (first, count, signal) => (first === 5 ? Promise.reject(engineDown) : deps.captureBatch(first, count, signal)),
    }),
  );
  assert.is(error, engineDown);
  assert.equal(records.map((r) => r.shard), [0]);
  assert.equal(await storage.listFiles('hj_capture_error'), [shardFileName(0, CLAIM), checkpointFileOf(shardFileName(0, CLAIM))]);
});

test('a throw from onShardWritten stops the pipeline and aborts the capture in flight', async () => {
  const { deps } = recorder();
  const superseded = new Error('claim superseded');
  const signals: AbortSignal[] = [];
  const error = await rejection(
    runShardPipeline(plan('hj_record_error'), {
      ...deps,
      captureBatch: (first, count, signal) => {
        signals.push(signal);
        return deps.captureBatch(first, count, signal);
      },
      onShardWritten: async () => {
        throw superseded;
      },
    }),
  );
  assert.is(error, superseded);
  assert.is(signals.length, 3, 'shard 0 and the prefetched first batch of shard 1, nothing after');
  assert.ok(signals[2].aborted);
  assert.equal(await storage.listFiles('hj_record_error'), [shardFileName(0, CLAIM), checkpointFileOf(shardFileName(0, CLAIM))], 'the written shard and its checkpoint stay (tidy removes unrecorded ones)');
});

test('captures that do not fit the job are refused before anything of them is written', async () => {
  const { deps } = recorder();
  const cases: Array<[string, (c: CapturedPrompt) => CapturedPrompt, RegExp]> = [
    ['layers', (c) => ({ ...c, shape: [2, c.shape[1], c.shape[2]], bytes: c.bytes.subarray(0, (c.bytes.length / 3) * 2) }), /holds 2 layers; the job captures 3/],
    ['tokens', (c) => ({ ...c, tokens: c.tokens.subarray(1) }), /token ids for \d+ captured positions/],
    ['width', (c) => ({ ...c, shape: [c.shape[0], c.shape[1] * 2, c.shape[2] / 2] }), /4 wide; the job's captures are 8/],
    ['bytes', (c) => ({ ...c, bytes: c.bytes.subarray(2) }), /do not hold bf16/],
  ];
  for (const [name, spoil, message] of cases) {
    const jobId = `hj_misfit_${name}`;
    const error = await rejection(
      runShardPipeline(plan(jobId, { dModel: name === 'width' ? null : D_MODEL }), {
        ...deps,
        captureBatch: async (first, count, signal) => (await deps.captureBatch(first, count, signal)).map((c, k) => (first + k === 4 ? spoil(c) : c)),
      }),
    );
    assert.match(error.message, message, name);
    assert.match(error.message, /^prompt 4:/, name);
    assert.equal(await storage.listFiles(jobId), [shardFileName(0, CLAIM), checkpointFileOf(shardFileName(0, CLAIM))], `${name}: shard 0 (and its checkpoint) only, no temporary file`);
  }
  const short = await rejection(runShardPipeline(plan('hj_misfit_count'), { ...deps, captureBatch: async (first) => [captured(first)] }));
  assert.match(short.message, /returned 1 captures/);
});

test('with CaptureBuffers, a capture’s buffer is decoded into again only once its batch is written', async () => {
  const { records, deps } = recorder();
  const buffers = new CaptureBuffers({ minBytes: 0 }); // these captures are tiny: pool them all
  await runShardPipeline(plan('hj_buffers', { promptCount: 12, shardSize: 6 }), {
    ...deps,
    buffers,
    async captureBatch(first, count) {
      await tick();
      return Array.from({ length: count }, (_, k) => captured(first + k, buffers));
    },
  });
  for (const record of records) checkShard('hj_buffers', record);
  assert.ok(buffers.made <= 2 * 2 + 1, `two batches of 2 and a scratch buffer at most (${buffers.made} made for 12 prompts)`);
});

test('each batch is asked for with the file offset its captures are written at (once the width is known), across shards', async () => {
  for (const dModel of [D_MODEL, null]) {
    const jobId = `hj_place_${dModel ?? 'unknown'}`;
    const { records, deps } = recorder();
    const buffers = new CaptureBuffers({ minBytes: 0 });
    const asked = new Map<number, number | undefined>();
    await runShardPipeline(plan(jobId, { promptCount: 11, shardSize: 5, batchSize: 2, dModel }), {
      ...deps,
      buffers,
      async captureBatch(first, count, _signal, place?: BatchPlace) {
        const offsets = captureOffsets(place!, Array.from({ length: count }, (_, k) => tokenCount(first + k)));
        offsets.forEach((offset, k) => asked.set(first + k, offset));
        return Array.from({ length: count }, (_, k) => captured(first + k, buffers, offsets[k]));
      },
    });
    assert.is(records.length, 3);
    for (const record of records) {
      checkShard(jobId, record);
      const file = readFileSync(join(root, jobId, record.file));
      const length = Number(file.readBigUInt64LE(0));
      const header = JSON.parse(file.subarray(8, 8 + length).toString('utf8'));
      for (let i = record.first_prompt; i < record.first_prompt + record.prompt_count; i++) {
        const expected = dModel === null && i < 2 ? undefined : 8 + length + header[`prompt_${i}`].data_offsets[0];
        assert.is(asked.get(i), expected, `${jobId}: prompt ${i}'s offset`);
      }
    }
  }
});

test('one shard of 300 prompts: the header written last fits the room reserved for it', async () => {
  const { records, deps } = recorder();
  await runShardPipeline(plan('hj_wide', { promptCount: 300, shardSize: 300, batchSize: 64, dModel: null }), deps);
  assert.is(records.length, 1);
  checkShard('hj_wide', records[0]);
});

test.run();
