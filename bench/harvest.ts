/**
 * The harvest data plane against the disk: the shard pipeline (decodeCapture + runShardPipeline, as a
 * worker runs them) writing real shards from capture response bodies held in memory, with a capture
 * function that answers at once, beside a raw write + fsync of the same bytes in the same file sizes to
 * the same disk, rounds interleaved in one run. Prints bytes/s, CPU seconds per GB (all threads) and the RSS each adds.
 *   node --import tsx bench/harvest.ts
 * Shape by environment: BENCH_HARVEST_PROMPTS (32), _LAYERS (16), _TOKENS (512), _D_MODEL (2048),
 * _SHARD (8 prompts), _BATCH (4), _ROUNDS (2); BENCH_HARVEST_DIR (default .bench/ in the repository, on
 * the disk DATA_DIR defaults to).
 */
import { Buffer } from 'node:buffer';
import { randomFillSync } from 'node:crypto';
import { mkdirSync, rmSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { cpus, loadavg, totalmem } from 'node:os';
import { join } from 'node:path';
import { setImmediate as yieldToLoop } from 'node:timers/promises';
import { CaptureBuffers, decodeCapture } from '../src/harvest/capture-decode.ts';
import { fileHarvestStorage, shardFileName } from '../src/harvest/storage.ts';
import { runShardPipeline, shardCountOf, type CapturedPrompt } from '../src/harvest/shard-pipeline.ts';
import { RunningStats } from '../src/harvest/stats.ts';
import { root } from './support.ts';

const setting = (name: string, fallback: number) => Number(process.env[`BENCH_HARVEST_${name}`] ?? fallback);
const prompts = setting('PROMPTS', 32);
const layers = setting('LAYERS', 16);
const tokens = setting('TOKENS', 512);
const dModel = setting('D_MODEL', 2048);
const shardSize = setting('SHARD', 8);
const batchSize = setting('BATCH', 4);
const rounds = setting('ROUNDS', 2);
const dir = join(process.env.BENCH_HARVEST_DIR ?? join(root, '.bench'), `harvest-${process.pid}`);
mkdirSync(dir, { recursive: true });
process.once('exit', () => rmSync(dir, { recursive: true, force: true }));

const promptBytes = layers * tokens * dModel * 2;
const distinctBodies = 4;

/** A vLLM-shaped capture response: the residual stream last, random activations (bf16 bits, or float32). */
function captureBody(dtype: 'bf16' | 'f32'): Buffer {
  const raw = Buffer.allocUnsafe(dtype === 'bf16' ? promptBytes : promptBytes * 2);
  randomFillSync(raw);
  if (dtype === 'f32') {
    // Finite values: random exponents within ±2^15, as activations are.
    const words = new Uint32Array(raw.buffer, raw.byteOffset, raw.length / 4);
    for (let i = 0; i < words.length; i++) words[i] = (words[i] & 0x807fffff) | ((112 + (words[i] & 31)) << 23);
  }
  const envelope = dtype === 'bf16' ? '"dtype":"int16","original_dtype":"torch.bfloat16"' : '"dtype":"float32","original_dtype":"torch.float32"';
  return Buffer.concat([
    Buffer.from(`{"id":"cmpl-bench","object":"text_completion","created":1,"model":"bench","choices":[{"index":0,"text":" ","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}],"usage":{"prompt_tokens":${tokens},"completion_tokens":1,"total_tokens":${tokens + 1}},"activations":{"residual_stream":{"data":"`),
    Buffer.from(raw.toString('base64'), 'latin1'),
    Buffer.from(`",${envelope},"compression":null,"shape":[${layers},${tokens},${dModel}]}}}`),
  ]);
}

const bodies = {
  bf16: Array.from({ length: distinctBodies }, () => captureBody('bf16')),
  f32: Array.from({ length: distinctBodies }, () => captureBody('f32')),
};
const tokenIds = Int32Array.from({ length: tokens }, (_, i) => i);
const layerList = Array.from({ length: layers }, (_, i) => i);

interface Measured {
  seconds: number;
  bytes: number;
  cpuSeconds: number;
  addedRssMb: number;
}

/** Runs `work` with its wall time, the process's CPU (every thread: the fs writes run in libuv's pool) and its peak RSS over the start. */
async function measure(work: () => Promise<number>): Promise<Measured> {
  (globalThis as { gc?: () => void }).gc?.();
  const rssBefore = process.memoryUsage.rss();
  let rssPeak = rssBefore;
  const sampler = setInterval(() => (rssPeak = Math.max(rssPeak, process.memoryUsage.rss())), 20);
  const cpu = process.cpuUsage();
  const started = performance.now();
  const bytes = await work();
  const seconds = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  clearInterval(sampler);
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  return { seconds, bytes, cpuSeconds: (used.user + used.system) / 1e6, addedRssMb: (rssPeak - rssBefore) / 2 ** 20 };
}

/** The floor: each shard's bytes written to a file in prompt-sized writes, then fsync, from a buffer already in memory. */
async function rawWrite(fileBytes: number[]): Promise<number> {
  const block = Buffer.alloc(promptBytes + tokens * 4, 0x5a);
  let total = 0;
  for (const [i, size] of fileBytes.entries()) {
    const handle = await open(join(dir, `raw-${i}`), 'wx');
    for (let at = 0; at < size; at += block.length) await handle.write(block, 0, Math.min(block.length, size - at), at);
    await handle.sync();
    await handle.close();
    total += size;
  }
  return total;
}

/** The pipeline writing every shard of a job whose captures answer at once from `captures`, decoded into pooled buffers or fresh ones. */
async function pipeline(captures: Buffer[], written: number[], pooled = true): Promise<number> {
  const storage = fileHarvestStorage(dir);
  const buffers = pooled ? new CaptureBuffers({ keep: 2 * batchSize + 1 }) : undefined;
  let total = 0;
  written.length = 0;
  await runShardPipeline(
    { jobId: 'hj_bench', checkpoint: 'bench/model', layers: layerList, dModel, promptCount: prompts, shardSize, batchSize, startShard: 0 },
    {
      storage,
      buffers,
      fileNameFor: (shard) => shardFileName(shard, 'cl_bench'),
      async captureBatch(first, count) {
        const out: CapturedPrompt[] = [];
        for (let k = 0; k < count; k++) {
          await yieldToLoop(); // a response arriving: the writes in flight get their turn
          const { shape, bytes } = decodeCapture(captures[(first + k) % captures.length], { layers, dModel }, buffers);
          out.push({ tokens: tokenIds, shape, bytes });
        }
        return out;
      },
      async onShardWritten(record) {
        written.push(record.bytes);
        total += record.bytes;
      },
    },
  );
  return total;
}

/** The statistics alone (what the pipeline adds per capture): every prompt's bf16 capture folded into RunningStats. */
const decodedBf16 = bodies.bf16.map((body) => decodeCapture(body, { layers, dModel }).bytes);
async function statsOnly(): Promise<number> {
  const stats = new RunningStats(layerList, dModel);
  let total = 0;
  for (let i = 0; i < prompts; i++) {
    const bytes = decodedBf16[i % decodedBf16.length];
    stats.add(bytes, [layers, tokens, dModel]);
    total += bytes.byteLength;
  }
  return total;
}

const shardFiles: number[] = [];
const results: Record<string, Measured[]> = { raw: [], bf16: [], fresh: [], f32: [], stats: [] };
const loadBefore = loadavg()[0];
// Each round: the pipeline on bf16 captures (its files' sizes are the raw writes' sizes), the raw writes, bf16 unpooled, float32 captures.
for (let round = 0; round < rounds; round++) {
  results.bf16.push(await measure(() => pipeline(bodies.bf16, shardFiles)));
  results.raw.push(await measure(() => rawWrite(shardFiles)));
  results.fresh.push(await measure(() => pipeline(bodies.bf16, [], false)));
  results.f32.push(await measure(() => pipeline(bodies.f32, [])));
  results.stats.push(await measure(statsOnly));
}
const loadAfter = loadavg()[0];

const gb = (bytes: number) => bytes / 1e9;
const rate = (m: Measured) => gb(m.bytes) / m.seconds;
const rawRate = Math.max(...results.raw.map(rate));
const rows = [
  ['raw write + fsync of the same bytes', results.raw],
  ['pipeline, bf16 captures (passed through)', results.bf16],
  ['the same, each capture decoded into a fresh buffer (no CaptureBuffers)', results.fresh],
  ['pipeline, float32 captures (rounded to bf16)', results.f32],
  ['the statistics alone (RunningStats.add over the bf16 captures; included in every pipeline row)', results.stats],
] as const;
const total = results.raw[0].bytes;
process.stdout.write(
  `harvest data plane: ${prompts} prompts of ${layers} x ${tokens} x ${dModel} bf16 (${(promptBytes / 2 ** 20).toFixed(0)} MiB each), shards of ${shardSize}, batches of ${batchSize}: ${shardCountOf(prompts, shardSize)} files, ${gb(total).toFixed(2)} GB per run; ${rounds} interleaved rounds, the best of each (on a shared machine the best is nearest the code's own cost)\n` +
    `${cpus().length} x ${cpus()[0]?.model ?? 'cpu'}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, Node ${process.version}; load average ${loadBefore.toFixed(2)} before, ${loadAfter.toFixed(2)} after; files under ${dir}\n\n` +
    `| path | GB/s, best (each round) | of raw | CPU s per GB, least (all threads) | RSS added, most |\n|---|---|---|---|---|\n` +
    rows
      .map(([name, ms]) => {
        const r = Math.max(...ms.map(rate));
        const cpu = Math.min(...ms.map((m) => m.cpuSeconds / gb(m.bytes)));
        return `| ${name} | ${r.toFixed(3)} (${ms.map((m) => rate(m).toFixed(3)).join(', ')}) | ${(r / rawRate).toFixed(2)} | ${cpu.toFixed(2)} | ${Math.max(...ms.map((m) => m.addedRssMb)).toFixed(0)} MB |`;
      })
      .join('\n') +
    '\n',
);
