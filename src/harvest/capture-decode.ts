// Turns an engine's capture response into the bf16 bytes a shard stores, as it arrives, without JSON.parse
// of the tensor and without a string of it: the codec reader finds the envelope's base64 text in the body's
// bytes and the bounded base64 decoder writes it straight into the buffer the shard writes. bf16 passes through
// untouched; float32 captures are rounded to bf16 (nearest even) by the WebAssembly module of stats-kernel.ts, float16 through a table.
import { Buffer } from 'node:buffer';
import { endianness } from 'node:os';
import { KernelMemory, KERNEL_MEMORY_MAX, kernelMemoryOf } from './stats-memory.ts';
import { fixedMemory, wasmF32ToBf16, type WasmMemory } from './stats-kernel.ts';
import { wasmBase64Into } from './base64-kernel.ts';
import { DIRECT_ALIGN } from './direct-writes.ts';
import { Base64Decoder, CodecError, CodecScanner, f16BitsToF32, f32ToBf16Bits, RESIDUAL_STREAM_PATH, zstdDecompressInto } from '../codec/index.ts';

/** The capture holds fewer layers than were asked for (or none): the engine's answer is incomplete. */
export class CaptureIncomplete extends Error {
  override name = 'CaptureIncomplete';
  readonly code = 'capture_incomplete';
}

export interface CaptureExpectation {
  /** Layers asked for: the capture's first dimension must equal it. */
  layers: number;
  /** The model's width when known; null takes the capture's. */
  dModel: number | null;
}

/** One prompt's capture as a shard takes it: its token ids and its residual stream as bf16 bytes. */
export interface CapturedPrompt {
  tokens: Int32Array;
  shape: readonly [layers: number, tokens: number, dModel: number];
  bytes: Uint8Array;
}

export interface DecodedCapture {
  shape: [layers: number, tokens: number, dModel: number];
  /** The residual stream as bf16, little-endian, row-major: layers × tokens × dModel × 2 bytes. */
  bytes: Buffer;
}

// Typed arrays use the host's byte order; the codec and safetensors are little-endian.
const LITTLE_ENDIAN = endianness() === 'LE';

/**
 * Buffers for decoded captures, taken again once a shard has written them (the pipeline gives them back):
 * a fresh buffer of tens of MB is mapped anew and faulted in page by page each time, about 0.5 s of
 * system CPU per GB decoded, as much as the decoding itself. Keeps at most `keep` free buffers; ones
 * under `minBytes` are left to the allocator. The buffers are regions of one kernel memory
 * (stats-memory.ts), room for `keep` + 2 of the largest capture seen, which the statistics kernel and the
 * float32 rounding work in without a copy; a capture larger than it was made for makes a larger one
 * (buffers of the older stay valid), and when it is full a buffer is allocated on its own.
 */
export class CaptureBuffers {
  readonly #keep: number;
  readonly #minBytes: number;
  readonly #free: Slab[] = [];
  /** Buffers handed out, by their memory and offset (so one given back twice, or not ours, is ignored). */
  readonly #lent = new WeakMap<ArrayBufferLike, Map<number, Slab>>();
  #memory: KernelMemory | null = null;
  #made = 0;
  /** The last capture decoded through these buffers was uncompressed float32: the next is rounded as its text decodes. */
  float32Last = false;

  constructor({ keep = 16, minBytes = 1 << 20 }: { keep?: number; minBytes?: number } = {}) {
    this.#keep = keep;
    this.#minBytes = minBytes;
  }

  /** Buffers allocated so far (the rest were taken again). */
  get made(): number {
    return this.#made;
  }

  /**
   * A buffer of `byteLength` bytes (old contents), aligned for any typed view; with `phase` (a multiple of
   * 4), one of kernel memory starts `phase` bytes past a 4 KiB boundary (a shard's file offset there, so its
   * whole blocks are written from it directly: direct-writes.ts) when it has room.
   */
  take(byteLength: number, phase?: number): Buffer {
    if (byteLength < this.#minBytes) {
      this.#made++;
      return Buffer.allocUnsafeSlow(byteLength);
    }
    const need = phase === undefined ? byteLength : byteLength + DIRECT_ALIGN;
    let best = -1;
    this.#free.forEach((slab, i) => {
      if (slab.capacity >= need && (best < 0 || slab.capacity < this.#free[best].capacity)) best = i;
    });
    const slab = best >= 0 ? this.#free.splice(best, 1)[0] : this.#slab(need);
    const shift = phase === undefined || slab.memory === null ? 0 : (((phase - slab.at) % DIRECT_ALIGN) + DIRECT_ALIGN) % DIRECT_ALIGN;
    let lent = this.#lent.get(slab.buffer);
    if (lent === undefined) this.#lent.set(slab.buffer, (lent = new Map()));
    lent.set(slab.at + shift, slab);
    return Buffer.from(slab.buffer, slab.at + shift, byteLength);
  }

  #slab(byteLength: number): Slab {
    this.#made++;
    // Capacity rounded up to whole MiB, so that captures a few tokens apart use the same buffers.
    const capacity = Math.ceil(byteLength / (1 << 20)) * (1 << 20);
    const room = (this.#keep + 2) * capacity;
    // A larger one at least twice as big, so captures growing a little at a time make few.
    if (this.#memory === null || (this.#memory.size < room && this.#memory.size < KERNEL_MEMORY_MAX)) {
      try {
        this.#memory = new KernelMemory(Math.max(room, 2 * (this.#memory?.size ?? 0)));
      } catch {
        // no address space or commit for it: buffers of their own
      }
    }
    const at = this.#memory?.alloc(capacity) ?? null;
    if (at !== null) return { buffer: this.#memory!.buffer, at, capacity, memory: this.#memory };
    return { buffer: Buffer.allocUnsafeSlow(capacity).buffer as ArrayBuffer, at: 0, capacity, memory: null };
  }

  /** Gives back a buffer `take` returned (or a view starting where it starts), once nothing reads it any more (others are ignored). */
  give(bytes: Uint8Array): void {
    const lent = this.#lent.get(bytes.buffer);
    const slab = lent?.get(bytes.byteOffset);
    if (slab === undefined) return;
    lent!.delete(bytes.byteOffset);
    this.#free.push(slab);
    if (this.#free.length > this.#keep) {
      const smallest = this.#free.reduce((m, b, i) => (b.capacity < this.#free[m].capacity ? i : m), 0);
      const [dropped] = this.#free.splice(smallest, 1);
      dropped.memory?.release(dropped.at);
    }
  }
}

/** A pooled buffer: `capacity` bytes at `at` of `buffer`, a region of kernel memory `memory` or an ArrayBuffer of its own. */
interface Slab {
  buffer: ArrayBuffer;
  at: number;
  capacity: number;
  memory: KernelMemory | null;
}

const unpooled = { take: (byteLength: number) => Buffer.allocUnsafeSlow(byteLength), give: () => {} };

/** Base64 characters decoded at a time when a float32 capture is rounded as it decodes (the decoded words stay in the cache). */
const ROUND_PIECE = 64 * 1024;

/** Room a body of unknown length starts with for its decoded tensor (it grows by doubling). */
const UNKNOWN_LENGTH_ROOM = 1 << 20;

/**
 * Decodes a capture response as its bytes arrive (`push` each chunk, then `end`): the codec reader finds
 * the residual stream's base64 text and it is decoded at once into one buffer (from `buffers`, sized from
 * the body's length when known), so no chunk is kept: they die young, where holding a body's hundreds of
 * 64 KiB chunks until its end had them promoted and collected by full GCs (about a third of a worker's
 * CPU). The tensor's shape and dtype come after its data in vLLM's body: `end` checks them, and converts
 * float32 or float16 to bf16 (or undoes zstd) into a second buffer. When the last capture through the same
 * CaptureBuffers was uncompressed float32, the text is rounded as it decodes, 64 KiB at a time while the
 * decoded words are in the cache (a capture of another dtype then just gives that buffer back). `discard`
 * gives the buffers back when the capture is abandoned.
 */
export class CaptureReader {
  readonly #expect: CaptureExpectation;
  readonly #buffers: Pick<CaptureBuffers, 'take' | 'give'> & { float32Last?: boolean };
  readonly #scanner: CodecScanner;
  readonly #room: number;
  #raw: Buffer | null = null;
  #decoder: Base64Decoder | null = null;
  /** bf16 rounded from #raw as it decodes, a piece at a time while the piece is in the cache (a float32 capture expected). */
  #out: Buffer | null = null;
  #round: ((src: number, count: number, dst: number) => void) | null = null;
  /** Words of #raw rounded into #out so far. */
  #rounded = 0;
  /** Where past a 4 KiB boundary the bf16 bytes are to start (CaptureBuffers.take), if anywhere. */
  readonly #phase: number | undefined;

  /**
   * `bodyLength`: the body's length when known (Content-Length): the decoded text is at most three quarters
   * of it. `phase`: the shard file offset the capture is written at (its place in a 4 KiB block is what
   * counts; ignored unless a multiple of 4).
   */
  constructor(expect: CaptureExpectation, buffers?: CaptureBuffers, bodyLength: number | null = null, phase?: number) {
    this.#expect = expect;
    this.#buffers = buffers ?? unpooled;
    this.#phase = phase !== undefined && phase % 4 === 0 ? phase % DIRECT_ALIGN : undefined;
    this.#room = bodyLength !== null && bodyLength > 0 ? Math.floor(bodyLength / 4) * 3 + 3 : UNKNOWN_LENGTH_ROOM;
    this.#scanner = new CodecScanner(RESIDUAL_STREAM_PATH, {
      start: () => {
        if (this.#decoder === null) {
          const float32 = this.#buffers.float32Last === true && bodyLength !== null;
          this.#raw = this.#buffers.take(this.#room, float32 ? undefined : this.#phase);
          const km = kernelMemoryOf(this.#raw);
          this.#decoder = new Base64Decoder(this.#raw, 0, km === undefined ? null : wasmBase64Into(km));
          if (float32) this.#expectFloat32();
        } else this.#decoder.reset();
        this.#rounded = 0;
      },
      text: (piece) => {
        const step = this.#out === null ? Math.max(piece.length, 1) : ROUND_PIECE;
        for (let at = 0; at < piece.length; at += step) this.#write(piece.subarray(at, at + step));
      },
      run: (buf, from, to) => this.#run(buf, from, to),
    });
  }

  /** Rounds as the text decodes, into a buffer of the same kernel memory (when there is one). */
  #expectFloat32(): void {
    const out = this.#buffers.take(Math.floor(this.#room / 4) * 2, this.#phase);
    const km = kernelMemoryOf(out);
    this.#round = km !== undefined && km === kernelMemoryOf(this.#raw!) ? wasmF32ToBf16(km.memory) : null;
    if (this.#round === null) this.#buffers.give(out);
    else this.#out = out;
  }

  #write(text: Uint8Array): void {
    const decoder = this.#decoder!;
    if (decoder.room < Math.ceil(text.length / 4) * 3 + 3) this.#grow(decoder.written + Math.ceil(text.length / 4) * 3 + 3);
    decoder.write(text);
    this.#roundDecoded();
  }

  /** Decodes the chunk's run of base64 from `from` (before `to`) where it lies; returns where the run stops. */
  #run(buf: Uint8Array, from: number, to: number): number {
    const decoder = this.#decoder!;
    const most = Math.ceil((to - from) / 4) * 3 + 3;
    if (decoder.room < most) this.#grow(decoder.written + most);
    if (this.#out === null) return decoder.run(buf, from, to);
    let at = from;
    for (;;) {
      const end = Math.min(to, at + ROUND_PIECE);
      at = decoder.run(buf, at, end);
      this.#roundDecoded();
      if (at < end || at === to) return at;
    }
  }

  /** Rounds the float32 words decoded since last time, 8 at a time (the rest at the end). */
  #roundDecoded(): void {
    if (this.#out === null) return;
    const n = ((this.#decoder!.written >>> 2) - this.#rounded) & ~7;
    if (n === 0) return;
    this.#round!(this.#raw!.byteOffset + this.#rounded * 4, n, this.#out.byteOffset + this.#rounded * 2);
    this.#rounded += n;
  }

  #dropOut(): void {
    if (this.#out !== null) this.#buffers.give(this.#out);
    this.#out = null;
  }

  push(chunk: Uint8Array): void {
    try {
      this.#scanner.push(chunk);
    } catch (err) {
      this.discard();
      throw err;
    }
  }

  /** The body ended: the capture as bf16, or `CodecError` / `CaptureIncomplete` (its buffer then given back). */
  end(): DecodedCapture {
    try {
      return this.#finish();
    } catch (err) {
      this.discard();
      throw err;
    }
  }

  /** Gives the decode buffer back (a capture abandoned or refused). */
  discard(): void {
    this.#dropOut();
    if (this.#raw !== null) this.#buffers.give(this.#raw);
    this.#raw = null;
    this.#decoder = null;
  }

  #grow(needed: number): void {
    // A body of unknown length: a buffer twice as big, what was decoded copied over.
    this.#dropOut(); // rounded at the end instead
    const next = this.#buffers.take(Math.max(needed, 2 * this.#raw!.length), this.#phase);
    this.#decoder!.moveTo(next);
    this.#buffers.give(this.#raw!);
    this.#raw = next;
  }

  #finish(): DecodedCapture {
    const expect = this.#expect;
    this.#scanner.end();
    const location = this.#scanner.codec();
    if (location === null) throw new CaptureIncomplete(`the capture returned no residual stream; ${expect.layers} layers were requested`);
    const [layers, tokens, dModel] = location.shape;
    if (location.shape.length !== 3) throw new CodecError(`the residual stream has shape [${location.shape.join(', ')}]; a capture is [layers, tokens, d_model]`);
    if (layers < expect.layers) throw new CaptureIncomplete(`the capture returned ${layers} of ${expect.layers} requested layers`);
    if (layers > expect.layers) throw new CodecError(`the capture returned ${layers} layers; ${expect.layers} were requested`);
    if (expect.dModel !== null && dModel !== expect.dModel) throw new CodecError(`the capture is ${dModel} wide; the model's d_model is ${expect.dModel}`);
    const { dtype, originalDtype } = location;
    const bf16 = dtype === 'int16' && originalDtype === 'torch.bfloat16';
    if (!bf16 && dtype !== 'float32' && dtype !== 'float16') {
      throw new CodecError(`the residual stream is ${dtype}${originalDtype ? ` (${originalDtype})` : ''}; a capture is bfloat16, float16 or float32`);
    }
    if (!bf16 && !LITTLE_ENDIAN) throw new CodecError('converting a capture to bf16 needs a little-endian host');
    const decoded = this.#decoder!.end();
    const text = this.#raw!.subarray(0, decoded);
    const float32 = dtype === 'float32' && location.compression === null;
    if (this.#buffers.float32Last !== undefined) this.#buffers.float32Last = float32;
    if (!float32) this.#dropOut();
    let wide: Buffer;
    if (location.compression === null) {
      if (decoded !== location.byteLength) throw new CodecError(`the data decodes to ${decoded} bytes; the tensor needs ${location.byteLength}`);
      wide = text;
    } else {
      // Never past the tensor's size: zstdDecompressInto refuses a frame that declares or decodes to more.
      wide = this.#buffers.take(location.byteLength, this.#phase);
      try {
        zstdDecompressInto(text, wide);
      } catch (err) {
        this.#buffers.give(wide);
        throw err;
      }
      this.#buffers.give(this.#raw!);
      this.#raw = wide;
    }
    if (bf16) {
      this.#raw = null;
      return { shape: [layers, tokens, dModel], bytes: wide };
    }
    const count = location.byteLength / (dtype === 'float32' ? 4 : 2);
    // Rounded already up to word #rounded when the text was rounded as it decoded.
    const done = this.#out === null ? 0 : this.#rounded;
    const out = this.#out?.subarray(0, count * 2) ?? this.#buffers.take(count * 2, this.#phase);
    this.#out = null;
    const halves = new Uint16Array(out.buffer, out.byteOffset + done * 2, count - done);
    if (dtype === 'float32') f32ToBf16(new Uint32Array(wide.buffer, wide.byteOffset + done * 4, count - done), halves);
    else f16ToBf16(new Uint16Array(wide.buffer, wide.byteOffset, count), halves);
    this.discard();
    return { shape: [layers, tokens, dModel], bytes: out };
  }
}

/**
 * Decodes the residual stream of a capture response (the body whole, or its chunks in order). A body
 * that is not JSON, or an envelope that is malformed, not a float tensor, not [layers, tokens, d_model]
 * or of another width throws `CodecError`; no envelope or fewer layers than expected throws `CaptureIncomplete`.
 */
export function decodeCapture(body: Uint8Array | readonly Uint8Array[], expect: CaptureExpectation, buffers?: CaptureBuffers, phase?: number): DecodedCapture {
  const chunks = body instanceof Uint8Array ? [body] : body;
  const reader = new CaptureReader(expect, buffers, chunks.reduce((n, c) => n + c.byteLength, 0), phase);
  for (const chunk of chunks) reader.push(chunk);
  return reader.end();
}

/** float32 words -> bf16, round to nearest even; a NaN stays a quiet NaN (as the codec's f32ToBf16Bits). */
function f32ToBf16(words: Uint32Array, out: Uint16Array): void {
  const km = kernelMemoryOf(words);
  const round = km !== undefined && out.buffer === words.buffer ? wasmF32ToBf16(km.memory) : null;
  const simd = words.length - (words.length % 8);
  const scratch = round === null ? roundingMemory() : null;
  if (round !== null) round(words.byteOffset, simd, out.byteOffset);
  else if (scratch !== null) {
    // Through a small kernel memory: a piece copied in, rounded, copied out (three copies cost less than the loop below).
    const heap = new Uint8Array(scratch.memory.buffer);
    for (let i = 0; i < simd; i += SCRATCH_WORDS) {
      const n = Math.min(SCRATCH_WORDS, simd - i);
      heap.set(new Uint8Array(words.buffer, words.byteOffset + i * 4, n * 4), 0);
      scratch.round(0, n, SCRATCH_WORDS * 4);
      new Uint8Array(out.buffer, out.byteOffset + i * 2, n * 2).set(heap.subarray(SCRATCH_WORDS * 4, SCRATCH_WORDS * 4 + n * 2));
    }
  }
  for (let i = round !== null || scratch !== null ? simd : 0; i < words.length; i++) {
    const w = words[i];
    out[i] = (w & 0x7fffffff) > 0x7f800000 ? (w >>> 16) | 0x0040 : (w + 0x7fff + ((w >>> 16) & 1)) >>> 16;
  }
}

/** Float32 words rounded at a time through the scratch memory. */
const SCRATCH_WORDS = 1 << 16;
let rounding: { memory: WasmMemory; round: (src: number, count: number, dst: number) => void } | null | undefined;
/** A small kernel memory to round in (null without WebAssembly SIMD). */
function roundingMemory() {
  if (rounding === undefined) {
    const memory = fixedMemory(((SCRATCH_WORDS * 6) >> 16) + 1);
    const round = wasmF32ToBf16(memory);
    rounding = round === null ? null : { memory, round };
  }
  return rounding;
}

let f16Table: Uint16Array | null = null;

/** float16 -> bf16 through a table of all 65,536 halves (each exact in float32, then rounded once). */
function f16ToBf16(halves: Uint16Array, out: Uint16Array): void {
  if (f16Table === null) {
    f16Table = new Uint16Array(65536);
    for (let h = 0; h < 65536; h++) f16Table[h] = f32ToBf16Bits(f16BitsToF32(h));
  }
  const table = f16Table;
  for (let i = 0; i < halves.length; i++) out[i] = table[halves[i]];
}
