// The bulk of a shard's bytes written around the page cache (O_DIRECT): each write's whole aligned
// blocks are written straight to the device, from the chunk itself where a chunk of kernel memory
// (stats-memory.ts) lies at the file offset's place in a block, else copied into an aligned staging
// buffer and written from there; the unaligned edges (at most a block each side, and the header) go
// through the page cache. On this project's VM a buffered write cost 0.3-2.8 CPU s per GB copying into
// fresh page-cache pages, a direct one 0.02-0.03, the staging copy 0.15. Linux keeps the two kinds
// coherent (a direct read or write flushes the cached blocks it covers); a file system that refuses
// O_DIRECT (tmpfs before Linux 6.6, some network file systems) gets only buffered writes.
import { constants } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';
import { fixedMemory } from './wasm-asm.ts';
import { kernelMemoryOf } from './stats-memory.ts';

/** Alignment of a direct write's offset, length and memory: a 4 KiB block (a multiple of any logical block size in use). */
export const DIRECT_ALIGN = 4096;
/** Bytes copied and written at a time. */
const STAGE = 8 << 20;
/** Writes shorter than this go through the page cache whole. */
const DIRECT_MIN = 1 << 20;

/** Aligned staging buffers (a WebAssembly memory starts on a 64 KiB boundary), reused across writers. */
const free: Uint8Array[] = [];
function takeStage(): Uint8Array {
  return free.pop() ?? new Uint8Array(fixedMemory(STAGE / 65536).buffer);
}

/** Writes whole aligned blocks with O_DIRECT through its own descriptor of the file. */
export class DirectWriter {
  readonly #handle: FileHandle;
  #stages: Uint8Array[] = [];

  private constructor(handle: FileHandle) {
    this.#handle = handle;
  }

  /** A writer for the file at `path` (already created), or null where the file system refuses O_DIRECT. */
  static async open(path: string): Promise<DirectWriter | null> {
    if (constants.O_DIRECT === undefined) return null;
    try {
      return new DirectWriter(await open(path, constants.O_WRONLY | constants.O_DIRECT));
    } catch {
      return null;
    }
  }

  /** The part of a write [position, position + length) worth writing direct: [from, to), or null. */
  static span(position: number, length: number): { from: number; to: number } | null {
    const from = Math.ceil(position / DIRECT_ALIGN) * DIRECT_ALIGN;
    const to = Math.floor((position + length) / DIRECT_ALIGN) * DIRECT_ALIGN;
    return to - from >= DIRECT_MIN ? { from, to } : null;
  }

  /**
   * Writes bytes [from, to) of the file, aligned, taken from `chunks` laid out from file offset `position`:
   * the whole blocks of a chunk whose memory is aligned as its file offset is written from the chunk, the
   * rest through the staging buffers (at most one write in flight).
   */
  async write(position: number, chunks: readonly Uint8Array[], from: number, to: number): Promise<void> {
    let flying: Promise<unknown> | null = null;
    let turn = 0; // the staging buffer to fill next (the other may be in flight)
    for (const run of directRuns(position, chunks, from, to)) {
      if (run.bytes !== null) {
        if (flying !== null) await flying;
        flying = writeAll(this.#handle, run.bytes, run.bytes.byteLength, run.from);
        continue;
      }
      if (this.#stages.length === 0) this.#stages = [takeStage(), takeStage()];
      for (let at = run.from; at < run.to; at += STAGE, turn ^= 1) {
        const stage = this.#stages[turn];
        const n = Math.min(STAGE, run.to - at);
        let filled = 0;
        for (const piece of rangeOf(chunks, at - position, at - position + n)) {
          stage.set(piece, filled);
          filled += piece.byteLength;
        }
        if (flying !== null) await flying;
        flying = writeAll(this.#handle, stage, n, at);
      }
    }
    if (flying !== null) await flying;
  }

  /** Closes its descriptor; its staging buffers go back for the next writer. */
  async close(): Promise<void> {
    free.push(...this.#stages.splice(0));
    await this.#handle.close();
  }
}

/**
 * [from, to) (aligned) cut into runs: a chunk's whole blocks where it lies in kernel memory (a WebAssembly
 * memory starts on a 64 KiB boundary) at the same place in a block as its file offset, as `bytes`;
 * the rest with `bytes` null (staged).
 */
export function directRuns(position: number, chunks: readonly Uint8Array[], from: number, to: number): { from: number; to: number; bytes: Uint8Array | null }[] {
  const runs: { from: number; to: number; bytes: Uint8Array | null }[] = [];
  const staged = (a: number, b: number) => {
    if (b <= a) return;
    const last = runs.at(-1);
    if (last !== undefined && last.bytes === null && last.to === a) last.to = b;
    else runs.push({ from: a, to: b, bytes: null });
  };
  let at = from;
  let chunkAt = position;
  for (const c of chunks) {
    const start = Math.max(Math.ceil(chunkAt / DIRECT_ALIGN) * DIRECT_ALIGN, at);
    const stop = Math.min(Math.floor((chunkAt + c.byteLength) / DIRECT_ALIGN) * DIRECT_ALIGN, to);
    if (stop - start >= DIRECT_ALIGN && (c.byteOffset - chunkAt) % DIRECT_ALIGN === 0 && kernelMemoryOf(c) !== undefined) {
      staged(at, start);
      runs.push({ from: start, to: stop, bytes: c.subarray(start - chunkAt, stop - chunkAt) });
      at = stop;
    }
    chunkAt += c.byteLength;
    if (at >= to) break;
  }
  staged(at, to);
  return runs;
}

async function writeAll(handle: FileHandle, stage: Uint8Array, n: number, position: number): Promise<void> {
  for (let done = 0; done < n; ) {
    const { bytesWritten } = await handle.write(stage, done, n - done, position + done);
    if (bytesWritten === 0) throw new Error(`a direct write at ${position + done} wrote nothing`);
    done += bytesWritten;
  }
}

/** Bytes [from, to) of the chunks laid end to end. */
export function rangeOf(chunks: readonly Uint8Array[], from: number, to: number): Uint8Array[] {
  const out: Uint8Array[] = [];
  let at = 0;
  for (const c of chunks) {
    const start = Math.max(from - at, 0);
    const stop = Math.min(to - at, c.byteLength);
    if (stop > start) out.push(c.subarray(start, stop));
    at += c.byteLength;
  }
  return out;
}

/** The chunks past their first `n` bytes. */
export function skipBytes(chunks: readonly Uint8Array[], n: number): Uint8Array[] {
  const out: Uint8Array[] = [];
  for (const c of chunks) {
    if (n >= c.byteLength) {
      n -= c.byteLength;
      continue;
    }
    out.push(n > 0 ? c.subarray(n) : c);
    n = 0;
  }
  return out;
}
