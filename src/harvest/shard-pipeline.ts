// Writes a harvest's shards from captures: prompts are captured a batch at a time, the next batch's
// capture runs while the current one is written, and each shard's tensors go to its file as their batch
// arrives, at offsets after room reserved for the header, which is written last. So memory holds two
// batches of captures whatever the shard size. A shard is recorded (onShardWritten, awaited) before the
// next one is written, so records arrive in shard order.
import { encodeSafetensorsHeader, headerRoom, layoutTensors, type PlacedTensor } from './safetensors.ts';
import type { HarvestStorage, ShardSink } from './storage.ts';
import type { CaptureBuffers, CapturedPrompt } from './capture-decode.ts';
import { RunningStats, checkpointFileOf } from './stats.ts';

export type { CapturedPrompt } from './capture-decode.ts';

import type { HarvestShard } from '../../events/harvest.ts';

/** What to write: the job's facts and where this run starts. */
export interface ShardPlan {
  jobId: string;
  checkpoint: string;
  /** Layers captured, ascending (the job's resolved list). */
  layers: readonly number[];
  /** Width of every capture when known; null takes the first capture's and holds every other to it. */
  dModel: number | null;
  promptCount: number;
  shardSize: number;
  /** Captures in flight at most: prompts asked of captureBatch at once. */
  batchSize: number;
  /** The first shard to write (the claim's next_shard); earlier ones are recorded already. */
  startShard: number;
}

export interface ShardPipelineDeps {
  storage: HarvestStorage;
  /** The file name of shard `shard` (storage.ts's shardFileName(shard, claimId): unique to the claim). */
  fileNameFor(shard: number): string;
  /**
   * Captures prompts [firstPrompt, firstPrompt + count), in order. A throw stops the pipeline and is rethrown.
   * `place`: where in its shard file the batch's first tensor is written (captureOffsets gives each
   * prompt's, to decode into buffers placed for direct writes: CaptureReader's `phase`).
   */
  captureBatch(firstPrompt: number, count: number, signal: AbortSignal, place?: BatchPlace): Promise<CapturedPrompt[]>;
  /** Called once a shard is fsynced under its name, before the next is written; a throw stops the pipeline. */
  onShardWritten(record: HarvestShard): Promise<void>;
  /** Stops the pipeline: no further capture or write, the shard being written is removed. */
  signal?: AbortSignal;
  /**
   * The buffers captureBatch decodes into (decodeCapture's third argument): each capture's bytes are given
   * back once written, so captureBatch must keep no reference to them.
   */
  buffers?: CaptureBuffers;
  /**
   * The running statistics as they stood after the last recorded shard (stats.ts; a resumed job loads
   * its checkpoint), or null to start from none: each prompt is folded in as its batch is written, and
   * after each shard's commit the sums are saved beside it (`<shard stem>.stats`) before it is recorded.
   */
  stats?: RunningStats | null;
}

export interface ShardPipelineResult {
  /** Shards written and recorded by this run. */
  shardsWritten: number;
  /** The captures' width (null when this run wrote nothing). */
  dModel: number | null;
  /** The running statistics over every shard up to the last (null when no shard of the job was ever captured). */
  stats: RunningStats | null;
}

/** Where a batch's captures are written: its first prompt's tensor at file offset `offset`; the width when known. */
export interface BatchPlace {
  offset: number;
  layers: number;
  dModel: number | null;
}

/** The file offset of each prompt's capture in a batch of prompts of these token counts (none without the width). */
export function captureOffsets(place: BatchPlace, tokenCounts: readonly number[]): (number | undefined)[] {
  let at = place.offset;
  return tokenCounts.map((tokens) => {
    if (place.dModel === null) return undefined;
    const offset = at;
    at += place.layers * tokens * place.dModel * 2 + tokens * 4; // the capture, then its token ids
    return offset;
  });
}

/** Shards a job of `promptCount` prompts makes at `shardSize` prompts each. */
export function shardCountOf(promptCount: number, shardSize: number): number {
  return Math.ceil(promptCount / shardSize);
}

interface Batch {
  shard: number;
  first: number;
  count: number;
}

/** Writes shards plan.startShard .. shardCount - 1; resolves once the last one is recorded. */
export async function runShardPipeline(plan: ShardPlan, deps: ShardPipelineDeps): Promise<ShardPipelineResult> {
  checkPlan(plan);
  const shardCount = shardCountOf(plan.promptCount, plan.shardSize);
  // Our own abort stops a capture still in flight when the pipeline fails for another reason.
  const stop = new AbortController();
  const signal = deps.signal ? AbortSignal.any([deps.signal, stop.signal]) : stop.signal;
  const batches: Batch[] = [];
  for (let shard = plan.startShard; shard < shardCount; shard++) {
    const end = Math.min((shard + 1) * plan.shardSize, plan.promptCount);
    for (let first = shard * plan.shardSize; first < end; first += plan.batchSize) batches.push({ shard, first, count: Math.min(plan.batchSize, end - first) });
  }
  const metadata = {
    job_id: plan.jobId,
    checkpoint: plan.checkpoint,
    layers: JSON.stringify(plan.layers),
  };
  let dModel = plan.dModel;
  let stats = deps.stats ?? null;
  let shardsWritten = 0;
  let next = 0;
  const dataStartOf = (shard: number) => headerRoom(tensorNames(shard * plan.shardSize, Math.min(plan.shardSize, plan.promptCount - shard * plan.shardSize)), metadata);
  /** The next batch, asked for once the current one's tensors are laid out (`end`: where they end in the file). */
  const capture = (shard: number, end: number): Promise<CapturedPrompt[]> | null => {
    const batch = batches[next++];
    if (batch === undefined) return null;
    const place = { offset: batch.shard === shard ? end : dataStartOf(batch.shard), layers: plan.layers.length, dModel };
    const pending = deps.captureBatch(batch.first, batch.count, signal, place);
    pending.catch(() => {}); // awaited below, or abandoned when the pipeline stops first
    return pending;
  };

  let pending = capture(-1, 0);
  let sink: ShardSink | null = null;
  try {
    for (let shard = plan.startShard; shard < shardCount; shard++) {
      const firstPrompt = shard * plan.shardSize;
      const promptCount = Math.min(plan.shardSize, plan.promptCount - firstPrompt);
      const file = deps.fileNameFor(shard);
      const placed: PlacedTensor[] = [];
      let dataStart = 0;
      let dataEnd = 0;
      let tokenCount = 0;
      for (let done = 0; done < promptCount; ) {
        const first = firstPrompt + done;
        const captured = await untilAborted(pending!, signal);
        const count = Math.min(plan.batchSize, promptCount - done);
        if (captured.length !== count) throw new Error(`captureBatch(${first}, ${count}) returned ${captured.length} captures`);
        dModel = checkCaptures(captured, first, plan.layers.length, dModel);
        if (done === 0) dataStart = dataStartOf(shard);
        // The whole batch in one positional writev: it runs in libuv's pool while the next batch is decoded.
        const chunks: Uint8Array[] = [];
        const batchStart = dataEnd;
        captured.forEach(({ tokens, shape, bytes }, k) => {
          const i = first + k;
          const tokenBytes = new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength);
          const { tensors } = layoutTensors([
            { name: `prompt_${i}`, dtype: 'BF16', shape, byteLength: bytes.byteLength },
            { name: `tokens_${i}`, dtype: 'I32', shape: [tokens.length], byteLength: tokenBytes.byteLength },
          ]);
          for (const t of tensors) placed.push({ ...t, begin: t.begin + dataEnd, end: t.end + dataEnd });
          chunks.push(bytes, tokenBytes);
          dataEnd += bytes.byteLength + tokenBytes.byteLength;
          tokenCount += tokens.length;
        });
        pending = capture(shard, dataStart + dataEnd); // the next batch is captured while this one is written
        sink ??= await deps.storage.createShard(plan.jobId, file);
        signal.throwIfAborted();
        const writing = sink.write(dataStart + batchStart, chunks);
        writing.catch(() => {}); // awaited below
        // The statistics are summed while the write runs in libuv's pool (both only read the bytes).
        stats ??= new RunningStats(plan.layers, dModel);
        for (const c of captured) stats.add(c.bytes, c.shape);
        await writing;
        for (const c of captured) deps.buffers?.give(c.bytes);
        done += count;
      }
      signal.throwIfAborted();
      await sink!.write(0, [encodeSafetensorsHeader(placed, metadata, dataStart)]);
      const stored = await sink!.commit();
      sink = null;
      // The sums as they stand after this shard, durable before the shard is recorded: a job resumed
      // after it goes on from exactly these (a checkpoint of a shard never recorded is left for tidy).
      const checkpoint = checkpointFileOf(file);
      await deps.storage.writeFile(plan.jobId, checkpoint, stats!.encodeCheckpoint({ jobId: plan.jobId, shard, shardSha256: stored.sha256 }));
      signal.throwIfAborted();
      await deps.onShardWritten({ shard, file, first_prompt: firstPrompt, prompt_count: promptCount, token_count: tokenCount, bytes: stored.bytes, sha256: stored.sha256 });
      shardsWritten++;
      // Only the newest recorded checkpoint is needed; an older one left by a crash here goes at tidy.
      if (stats!.checkpointFile !== null && stats!.checkpointFile !== checkpoint) await deps.storage.removeFile(plan.jobId, stats!.checkpointFile).catch(() => undefined);
      stats!.checkpointFile = checkpoint;
    }
  } catch (err) {
    stop.abort(err);
    if (sink !== null) await sink.abort();
    throw err;
  }
  return { shardsWritten, dModel, stats };
}

function checkPlan(plan: ShardPlan): void {
  const positive = (n: number) => Number.isSafeInteger(n) && n > 0;
  if (!positive(plan.promptCount) || !positive(plan.shardSize) || !positive(plan.batchSize)) throw new Error('promptCount, shardSize and batchSize must be positive integers');
  if (plan.layers.length === 0) throw new Error('the plan captures no layer');
  const shardCount = shardCountOf(plan.promptCount, plan.shardSize);
  if (!Number.isSafeInteger(plan.startShard) || plan.startShard < 0 || plan.startShard > shardCount) throw new Error(`startShard ${plan.startShard} is outside 0..${shardCount}`);
}

function tensorNames(firstPrompt: number, promptCount: number) {
  const names = [];
  for (let i = firstPrompt; i < firstPrompt + promptCount; i++) names.push({ name: `prompt_${i}`, dtype: 'BF16' as const, rank: 3 }, { name: `tokens_${i}`, dtype: 'I32' as const, rank: 1 });
  return names;
}

/** Every capture of a batch: [layers, tokens, d_model] of bf16, one token id per position, one width for the job. */
function checkCaptures(captured: readonly CapturedPrompt[], first: number, layers: number, dModel: number | null): number {
  let width = dModel;
  captured.forEach((c, k) => {
    const [l, t, d] = c.shape;
    const where = `prompt ${first + k}`;
    if (l !== layers) throw new Error(`${where}: the capture holds ${l} layers; the job captures ${layers}`);
    width ??= d;
    if (d !== width) throw new Error(`${where}: the capture is ${d} wide; the job's captures are ${width}`);
    if (c.tokens.length !== t) throw new Error(`${where}: ${c.tokens.length} token ids for ${t} captured positions`);
    if (c.bytes.byteLength !== l * t * d * 2) throw new Error(`${where}: ${c.bytes.byteLength} bytes do not hold bf16 [${l}, ${t}, ${d}]`);
  });
  return width!;
}

/** `promise`, or the abort's reason as soon as `signal` aborts (the promise is then left to settle alone). */
function untilAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    promise.then(
      (value) => {
        signal.removeEventListener('abort', onAbort);
        resolve(value);
      },
      (err) => {
        signal.removeEventListener('abort', onAbort);
        reject(err);
      },
    );
  });
}
