// A harvest's statistics, computed as the shards are written: for each layer, the mean and standard
// deviation of every dimension and the mean L2 norm of a token, over every harvested token but each
// prompt's position 0 (the BOS token). The values are the shard's bf16 values. The sums run in float64
// in one fixed order, token after token in prompt order, about a shift (the first prompt's mean), so the
// numbers do not depend on how the prompts were cut into shards or batches, and a job resumed from its
// last recorded shard's checkpoint (the running sums as they stood, saved beside that shard) ends with
// the same bits as one never interrupted.
import { Buffer } from 'node:buffer';
import { decodeSafetensors, encodeSafetensors } from './safetensors.ts';
import { fixedMemory, GROUP_BYTES, jsRowsKernel, wasmRowsKernel, type RowsKernel, type WasmMemory } from './stats-kernel.ts';
import { kernelMemoryOf, type KernelMemory } from './stats-memory.ts';
import { STATS_FILE, type HarvestStorage } from './storage.ts';
import type { ManifestStats } from './manifest.ts';
import type { HarvestShard } from '../../events/harvest.ts';

/** The job's statistics file: `stats.safetensors`, beside the shards, written before manifest.json. */
export { STATS_FILE };
/** The `format` metadata of a running-sums checkpoint (`<shard file stem>.stats`). */
const CHECKPOINT_FORMAT = 'svc-harvest-running-stats/1';
/** bf16 rows copied into the kernel's memory at a time, when not summed in place (stays in the cache while it is summed). */
const CHUNK_BYTES = 256 * 1024;

export class HarvestStatsError extends Error {
  override name = 'HarvestStatsError';
}

/** The checkpoint beside shard file `shard-00003-<claim>.safetensors`: `shard-00003-<claim>.stats`. */
export function checkpointFileOf(shardFile: string): string {
  return shardFile.replace(/\.safetensors$/, '') + '.stats';
}


/** Index of dimension `d`'s `part` (0 shift, 1 sum, 2 sum of squares) in a layer's state as float64. */
const at = (d: number, part: number) => (d >> 2) * (GROUP_BYTES / 8) + part * 4 + (d & 3);

/** The running sums of a job: fold prompts in, in prompt order. */
export class RunningStats {
  readonly layers: readonly number[];
  readonly dModel: number;
  /** Prompts folded in so far (the next one to fold is this index). */
  prompts = 0;
  /** Tokens counted so far (each prompt's tokens but its first). */
  tokens = 0;
  /** The checkpoint file these sums were last saved to or loaded from (the pipeline removes it once a newer one is recorded). */
  checkpointFile: string | null = null;
  readonly #js: boolean;
  readonly #width: number; // d_model rounded up to a multiple of 4 (the kernel's step)
  readonly #norms: Float64Array;
  /** Where the sums live: a memory of their own, or a region of the kernel memory captures are decoded into (stats-memory.ts). */
  #home: { kernel: RowsKernel; base: number; owner: KernelMemory | null };
  #shifted = false;

  constructor(layers: readonly number[], dModel: number, options: { kernel?: 'wasm' | 'js' } = {}) {
    if (layers.length === 0 || !Number.isSafeInteger(dModel) || dModel < 1) throw new HarvestStatsError('statistics need at least one layer and a width');
    this.layers = [...layers];
    this.dModel = dModel;
    this.#width = Math.ceil(dModel / 4) * 4;
    this.#js = options.kernel === 'js';
    this.#home = { kernel: this.#kernelOver(fixedMemory(Math.ceil(this.#regionBytes() / 65536))), base: 0, owner: null };
    this.#norms = new Float64Array(layers.length);
  }

  #kernelOver(memory: WasmMemory): RowsKernel {
    return (this.#js ? null : wasmRowsKernel(memory)) ?? jsRowsKernel(memory);
  }

  // The region: a chunk rows are copied into (when not summed in place), the shift's scratch sums, the layers' states.
  #chunkBytes(): number {
    return Math.max(CHUNK_BYTES, this.#width * 2);
  }

  #layerBytes(): number {
    return (this.#width / 4) * GROUP_BYTES;
  }

  #regionBytes(): number {
    return this.#chunkBytes() + this.#width * 8 + this.layers.length * this.#layerBytes();
  }

  /** Where layer `l`'s state lies in the kernel's memory (groups of four dimensions: shift, sum, sum of squares). */
  #state(l: number): number {
    return this.#home.base + this.#chunkBytes() + this.#width * 8 + l * this.#layerBytes();
  }

  /** Layer `l`'s state as float64; `at(d, part)` indexes it (part 0 shift, 1 sum, 2 sum of squares). */
  #view(l: number): Float64Array {
    return new Float64Array(this.#home.kernel.memory.buffer, this.#state(l), this.#layerBytes() / 8);
  }

  /** Moves the sums into kernel memory `km` (when it has room), so captures decoded there are summed in place. */
  #moveTo(km: KernelMemory): void {
    const at = km.alloc(this.#regionBytes());
    if (at === null) return;
    const old = this.#home;
    const from = this.#state(0);
    const bytes = this.layers.length * this.#layerBytes();
    this.#home = { kernel: this.#kernelOver(km.memory), base: at, owner: km };
    new Uint8Array(km.buffer, this.#state(0), bytes).set(new Uint8Array(old.kernel.memory.buffer, from, bytes));
    old.owner?.release(old.base);
  }

  /** Folds one prompt's capture in: bf16 [layers, tokens, d_model] as the shard stores it. */
  add(bytes: Uint8Array, shape: readonly [number, number, number]): void {
    const [layers, tokens, width] = shape;
    if (layers !== this.layers.length || width !== this.dModel || bytes.byteLength !== layers * tokens * width * 2) {
      throw new HarvestStatsError(`a capture of shape [${shape.join(', ')}] does not fit statistics of ${this.layers.length} layers × ${this.dModel}`);
    }
    this.prompts++;
    const rows = tokens - 1;
    if (rows <= 0) return;
    // Rows of a width the kernel steps by are summed where they lie when they lie in kernel memory.
    const km = width === this.#width ? kernelMemoryOf(bytes) : undefined;
    if (km !== undefined && km.serial > (this.#home.owner?.serial ?? 0)) this.#moveTo(km);
    const inPlace = km !== undefined && km === this.#home.owner;
    const kernel = this.#home.kernel;
    if (!this.#shifted) this.#setShift(bytes, tokens, inPlace);
    for (let l = 0; l < layers; l++) {
      const state = this.#state(l);
      let norm = this.#norms[l];
      this.#rowsOf(bytes, tokens, l, inPlace, (src, n) => (norm = kernel.accumulate(src, n, this.#width, state, norm)));
      this.#norms[l] = norm;
    }
    this.tokens += rows;
  }

  /**
   * Runs `fold` over layer `l`'s rows 1.. of a capture, in order, as (offset in the kernel's memory, rows):
   * at once where they lie, or an even number of rows at a time copied into the chunk (so a chunk's edge
   * never splits one of the kernel's pairs), each row padded to the kernel's width.
   */
  #rowsOf(bytes: Uint8Array, tokens: number, l: number, inPlace: boolean, fold: (src: number, rows: number) => void): void {
    const rowBytes = this.dModel * 2;
    if (inPlace) return fold(bytes.byteOffset + (l * tokens + 1) * rowBytes, tokens - 1);
    const heap = new Uint8Array(this.#home.kernel.memory.buffer);
    const chunk = this.#home.base;
    const perChunk = Math.max(1, Math.floor(this.#chunkBytes() / (this.#width * 4)) * 2);
    for (let r = 1; r < tokens; r += perChunk) {
      const n = Math.min(perChunk, tokens - r);
      const from = bytes.byteOffset + (l * tokens + r) * rowBytes;
      if (this.dModel === this.#width) heap.set(new Uint8Array(bytes.buffer, from, n * rowBytes), chunk);
      else for (let k = 0; k < n; k++) heap.set(new Uint8Array(bytes.buffer, from + k * rowBytes, rowBytes), chunk + k * this.#width * 2);
      fold(chunk, n);
    }
  }

  /** The shift is the first counted prompt's mean (per layer and dimension): near the data's mean, so the sums cancel little. */
  #setShift(bytes: Uint8Array, tokens: number, inPlace: boolean): void {
    const kernel = this.#home.kernel;
    const scratch = this.#home.base + this.#chunkBytes();
    // Each dimension's sum in token order (float64).
    for (let l = 0; l < this.layers.length; l++) {
      const sums = new Float64Array(kernel.memory.buffer, scratch, this.#width).fill(0);
      this.#rowsOf(bytes, tokens, l, inPlace, (src, n) => kernel.sumRows(src, n, this.#width, scratch));
      const view = this.#view(l);
      for (let d = 0; d < this.dModel; d++) view[at(d, 0)] = sums[d] / (tokens - 1);
    }
    this.#shifted = true;
  }

  /** The statistics: mean and (population) standard deviation per layer and dimension, mean token norm per layer. */
  result(): { mean: Float32Array; std: Float32Array; meanNorm: Float64Array; tokens: number } {
    const L = this.layers.length;
    const D = this.dModel;
    const n = this.tokens;
    const mean = new Float32Array(L * D);
    const std = new Float32Array(L * D);
    const meanNorm = new Float64Array(L);
    for (let l = 0; l < L; l++) {
      const view = this.#view(l);
      for (let d = 0; d < D; d++) {
        const m = view[at(d, 1)] / n;
        mean[l * D + d] = view[at(d, 0)] + m;
        std[l * D + d] = Math.sqrt(Math.max(0, view[at(d, 2)] / n - m * m));
      }
      meanNorm[l] = this.#norms[l] / n;
    }
    return { mean, std, meanNorm, tokens: n };
  }

  /** `stats.safetensors`: token_count I64 [1], mean_norm F64 [L], mean and std F32 [L, D], layer_indices I32 [L]. */
  encodeFile(jobId: string): Buffer {
    const { mean, std, meanNorm, tokens } = this.result();
    const L = this.layers.length;
    const bytesOf = (a: ArrayBufferView) => new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
    return encodeSafetensors(
      [
        { name: 'token_count', dtype: 'I64', shape: [1], bytes: bytesOf(BigInt64Array.of(BigInt(tokens))) },
        { name: 'mean_norm', dtype: 'F64', shape: [L], bytes: bytesOf(meanNorm) },
        { name: 'mean', dtype: 'F32', shape: [L, this.dModel], bytes: bytesOf(mean) },
        { name: 'std', dtype: 'F32', shape: [L, this.dModel], bytes: bytesOf(std) },
        { name: 'layer_indices', dtype: 'I32', shape: [L], bytes: bytesOf(Int32Array.from(this.layers)) },
      ],
      { format: 'svc-harvest-stats/1', job_id: jobId, layers: JSON.stringify(this.layers), d_model: String(this.dModel), token_count: String(tokens), excluded_positions: '[0]', std: 'population' },
    );
  }

  /** Mean token norm per layer for the manifest (null when no token was counted). */
  meanTokenNorms(): (number | null)[] {
    return Array.from(this.#norms, (s) => (this.tokens > 0 ? s / this.tokens : null));
  }

  /** The running sums as they stand after shard `shard` (whose file has `shardSha256`), to resume from exactly. */
  encodeCheckpoint(meta: { jobId: string; shard: number; shardSha256: string }): Buffer {
    const L = this.layers.length;
    const D = this.dModel;
    const gather = (part: number) => {
      const out = new Float64Array(L * D);
      for (let l = 0; l < L; l++) {
        const view = this.#view(l);
        for (let d = 0; d < D; d++) out[l * D + d] = view[at(d, part)];
      }
      return new Uint8Array(out.buffer);
    };
    return encodeSafetensors(
      [
        { name: 'shift', dtype: 'F64', shape: [L, D], bytes: gather(0) },
        { name: 'sum', dtype: 'F64', shape: [L, D], bytes: gather(1) },
        { name: 'sum_sq', dtype: 'F64', shape: [L, D], bytes: gather(2) },
        { name: 'norm_sum', dtype: 'F64', shape: [L], bytes: new Uint8Array(this.#norms.slice().buffer) },
      ],
      {
        format: CHECKPOINT_FORMAT,
        job_id: meta.jobId,
        shard: String(meta.shard),
        shard_sha256: meta.shardSha256,
        layers: JSON.stringify(this.layers),
        d_model: String(D),
        prompts: String(this.prompts),
        tokens: String(this.tokens),
        shifted: String(this.#shifted),
      },
    );
  }

  /**
   * The running sums a checkpoint holds, checked against what the job recorded: the same job, shard,
   * shard file hash, layers and prompt count. Throws HarvestStatsError when it is not that checkpoint.
   */
  static fromCheckpoint(file: Uint8Array, expect: { jobId: string; shard: number; shardSha256: string; layers: readonly number[]; prompts: number }, options: { kernel?: 'wasm' | 'js' } = {}): RunningStats {
    let parsed: ReturnType<typeof decodeSafetensors>;
    try {
      parsed = decodeSafetensors(file);
    } catch (err) {
      throw new HarvestStatsError(`the checkpoint is not a safetensors file: ${(err as Error).message}`);
    }
    const m = parsed.metadata;
    const mismatch =
      m.format !== CHECKPOINT_FORMAT ? 'format'
      : m.job_id !== expect.jobId ? 'job'
      : m.shard !== String(expect.shard) ? 'shard'
      : m.shard_sha256 !== expect.shardSha256 ? 'shard file'
      : m.layers !== JSON.stringify(expect.layers) ? 'layers'
      : m.prompts !== String(expect.prompts) ? 'prompt count'
      : null;
    if (mismatch) throw new HarvestStatsError(`the checkpoint is of another ${mismatch}`);
    const D = Number(m.d_model);
    const stats = new RunningStats(expect.layers, D, options);
    const L = expect.layers.length;
    const tensor = (name: string, length: number) => {
      const t = parsed.tensors.get(name);
      if (!t || t.dtype !== 'F64' || t.bytes.byteLength !== length * 8) throw new HarvestStatsError(`the checkpoint's ${name} is missing or malformed`);
      return new Float64Array(t.bytes.buffer, t.bytes.byteOffset, length);
    };
    const parts = [tensor('shift', L * D), tensor('sum', L * D), tensor('sum_sq', L * D)];
    for (let l = 0; l < L; l++) {
      const view = stats.#view(l);
      for (let part = 0; part < 3; part++) for (let d = 0; d < D; d++) view[at(d, part)] = parts[part][l * D + d];
    }
    stats.#norms.set(tensor('norm_sum', L));
    stats.prompts = expect.prompts;
    stats.tokens = Number(m.tokens);
    stats.#shifted = m.shifted === 'true';
    if (!Number.isSafeInteger(stats.tokens) || stats.tokens < 0) throw new HarvestStatsError('the checkpoint token count is malformed');
    return stats;
  }
}

/** Reads `length` bytes of a file from `position` (a recorded shard, through the storage). */
export type ReadRange = (position: number, length: number) => Promise<Uint8Array>;

/**
 * Folds a recorded shard's prompts into `stats`, in order, reading the file a tensor at a time (resuming
 * without a usable checkpoint: the statistics are recomputed from what is durable).
 */
export async function foldShardFile(stats: RunningStats | null, read: ReadRange, layers: readonly number[]): Promise<RunningStats> {
  const head = Buffer.from(await read(0, 8));
  const headerLength = Number(head.readBigUInt64LE(0));
  const header = JSON.parse(Buffer.from(await read(8, headerLength)).toString('utf8')) as Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>;
  const prompts = Object.keys(header)
    .filter((k) => k.startsWith('prompt_'))
    .map((k) => Number(k.slice(7)))
    .sort((a, b) => a - b);
  let out = stats;
  for (const i of prompts) {
    const t = header[`prompt_${i}`];
    if (t.dtype !== 'BF16' || t.shape.length !== 3) throw new HarvestStatsError(`prompt_${i} is not bf16 [layers, tokens, d_model]`);
    const [begin, end] = t.data_offsets;
    const bytes = await read(8 + headerLength + begin, end - begin);
    out ??= new RunningStats(layers, t.shape[2]);
    out.add(bytes, t.shape as [number, number, number]);
  }
  if (out === null) throw new HarvestStatsError('the shard holds no prompt');
  return out;
}

/**
 * The running statistics a job resumes from: null when no shard is recorded; else the checkpoint saved
 * beside its last recorded shard, or, when that is missing or not that shard's, the sums recomputed from
 * the recorded shard files themselves (the same arithmetic in the same order, so the same bits).
 */
export async function resumeStats(storage: HarvestStorage, jobId: string, shards: readonly HarvestShard[], layers: readonly number[]): Promise<RunningStats | null> {
  const last = shards.at(-1);
  if (last === undefined) return null;
  const file = checkpointFileOf(last.file);
  const saved = await storage.readFile(jobId, file).catch(() => null);
  if (saved !== null) {
    try {
      const stats = RunningStats.fromCheckpoint(saved, { jobId, shard: last.shard, shardSha256: last.sha256, layers, prompts: last.first_prompt + last.prompt_count });
      stats.checkpointFile = file;
      return stats;
    } catch {
      // not that shard's sums: recomputed below
    }
  }
  let stats: RunningStats | null = null;
  for (const shard of shards) stats = await foldShardFile(stats, (position, length) => storage.readRange(jobId, shard.file, position, length), layers);
  return stats;
}

/** Writes stats.safetensors (before the manifest) and returns what the manifest says of it; null without statistics. */
export async function writeStatsFile(storage: HarvestStorage, jobId: string, stats: RunningStats | null): Promise<ManifestStats | null> {
  if (stats === null) return null;
  const stored = await storage.writeFile(jobId, STATS_FILE, stats.encodeFile(jobId));
  return { file: STATS_FILE, bytes: stored.bytes, sha256: stored.sha256, token_count: stats.tokens, mean_token_norm: stats.meanTokenNorms() };
}
