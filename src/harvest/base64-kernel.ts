// Base64 decoding in WebAssembly SIMD, from a piece of text copied into a kernel memory's scratch
// (stats-memory.ts) straight into a capture buffer of the same memory: no string, no garbage. 64 characters
// a pass, 16 at a time: each character checked and mapped to its 6 bits by nibble lookups (W. Muła's
// method), the bits packed by a shift and a dot product, 12 bytes stored a block. Only the standard alphabet
// without padding passes; the first block with anything else (the closing quote, padding, the URL-safe
// alphabet, a stray byte) stops it where it begins, and Base64Decoder decodes the rest (codec/base64.ts).
import { bump, get, I32, i32, instancesOf, memarg, op, s, set, simd, V128, type WasmFunction } from './wasm-asm.ts';
import { SCRATCH_BYTES, type KernelMemory } from './stats-memory.ts';
import type { Base64Prefix } from '../codec/index.ts';

// Valid characters are those where lo[c & 15] & hi[c >> 4] is 0: '+' and '/' (high nibble 2), digits (3),
// letters (4-7); every other high nibble's entry meets every low nibble's.
const LO = [0x15, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x13, 0x1a, 0x1b, 0x1b, 0x1b, 0x1a];
const HI = [0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10];
// Added to a character to give its 6 bits, by high nibble ('/' looks up the entry before its own).
const ROLL = [0, 16, 19, 4, -65, -65, -71, -71, 0, 0, 0, 0, 0, 0, 0, 0];

/** The constants decode reads from memory (so that they stay in registers, not rebuilt each pass): 16 bytes each. */
const CONSTANTS = [
  LO,
  HI,
  ROLL,
  new Array(16).fill(0x0f),
  new Array(16).fill(0x2f),
  new Array(8).fill([0xff, 0x00]).flat(), // low byte of each i16
  new Array(4).fill([0x00, 0x10, 0x01, 0x00]).flat(), // i16 lanes 4096, 1
  [2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, 0x80, 0x80, 0x80, 0x80], // each group's three bytes, most significant first
];
/** Bytes of the constants, then the text, in the scratch. */
const CONSTANTS_BYTES = CONSTANTS.length * 16;

/**
 * decode(src, n, dst, k) -> characters decoded: 16-character blocks from src (n a multiple of 16) into dst
 * (12 bytes each) up to the first block holding a character not standard base64, which is not stored (k: the constants).
 */
function decodeBody(): Pick<WasmFunction, 'locals' | 'body'> {
  const [src, n, dst, k] = [0, 1, 2, 3];
  const [end, start] = [4, 5];
  const [lo, hi, roll, low4, slash, low8, weights, order, c, nib] = [6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
  // 16 characters at src + 16j -> 12 bytes at dst + 12j; a block with a stray character ends the run (src moved to it)
  const block = (j: number) => [
    ...get(src), ...s(simd.load), ...memarg(0, 16 * j), ...set(c),
    ...get(c), ...i32(4), ...s(simd.i16x8shrU), ...get(low4), ...s(simd.and), ...set(nib),
    // lo[c & 15] & hi[c >> 4] is 0 for every character of the alphabet
    ...get(lo), ...get(c), ...get(low4), ...s(simd.and), ...s(simd.swizzle),
    ...get(hi), ...get(nib), ...s(simd.swizzle),
    ...s(simd.and), ...s(simd.anyTrue),
    op.if, 0x40, ...(j > 0 ? bump(src, 16 * j) : []), op.br, 3, op.end,
    // c += roll[(c >> 4) + (c == '/' ? -1 : 0)]
    ...get(c),
    ...get(roll), ...get(c), ...get(slash), ...s(simd.i8x16eq), ...get(nib), ...s(simd.i8x16add), ...s(simd.swizzle),
    ...s(simd.i8x16add), ...set(c),
    // pairs of 6 bits -> 12 (a << 6 | b in each i16), pairs of those -> 24 (p << 12 | q in each i32), in order
    ...get(c), ...get(low8), ...s(simd.and), ...i32(6), ...s(simd.i16x8shl),
    ...get(c), ...i32(8), ...s(simd.i16x8shrU),
    ...s(simd.or),
    ...get(weights), ...s(simd.i32x4dotI16x8S),
    ...get(order), ...s(simd.swizzle), ...set(c),
    ...get(dst), ...get(c), ...s(simd.store64lane), ...memarg(0, 12 * j), 0,
    ...get(dst), ...get(c), ...s(simd.store32lane), ...memarg(0, 12 * j + 8), 2,
  ];
  const constant = (local: number, i: number) => [...get(k), ...s(simd.load), ...memarg(0, 16 * i), ...set(local)];
  // Four blocks a pass while 64 characters are left, then one at a time.
  const loop = (blocks: number) => [
    op.loop, 0x40,
    ...get(src), ...i32(16 * blocks), op.i32add, ...get(end), op.i32gtU, op.br_if, 1,
    ...Array.from({ length: blocks }, (_, j) => block(j)).flat(),
    ...bump(src, 16 * blocks), ...bump(dst, 12 * blocks),
    op.br, 0,
    op.end,
  ];
  const body = [
    ...[lo, hi, roll, low4, slash, low8, weights, order].flatMap(constant),
    ...get(src), ...set(start),
    ...get(src), ...get(n), op.i32add, ...set(end),
    op.block, 0x40,
    op.block, 0x40, ...loop(4), op.end,
    op.block, 0x40, ...loop(1), op.end,
    op.end,
    ...get(src), ...get(start), op.i32sub,
  ];
  return { locals: [[2, I32], [10, V128]], body };
}

const exportsOver = instancesOf((): WasmFunction[] => [{ name: 'decode', params: [I32, I32, I32, I32], results: [I32], ...decodeBody() }]);

/**
 * A decoder of base64 text into `km`'s buffers (Base64Decoder's `prefix`): it decodes the longest prefix
 * of whole 16-character blocks of the standard alphabet and returns its length; 0 for a destination in
 * another memory. Null without WebAssembly SIMD.
 */
export function wasmBase64Into(km: KernelMemory): Base64Prefix | null {
  let found = decoders.get(km);
  if (found === undefined) decoders.set(km, (found = decoderOver(km)));
  return found;
}

const decoders = new WeakMap<KernelMemory, Base64Prefix | null>();

function decoderOver(km: KernelMemory): Base64Prefix | null {
  const exports = exportsOver(km.memory);
  if (exports === null) return null;
  const decode = exports.decode as (src: number, n: number, dst: number, constants: number) => number;
  const heap = new Uint8Array(km.buffer);
  const constants = km.scratch;
  heap.set(CONSTANTS.flat(), constants);
  const scratch = constants + CONSTANTS_BYTES;
  return (text, dest, at) => {
    if (dest.buffer !== km.buffer) return 0;
    const whole = text.length & ~15;
    let done = 0;
    while (done < whole) {
      const n = Math.min(SCRATCH_BYTES - CONSTANTS_BYTES, whole - done);
      heap.set(text.subarray(done, done + n), scratch);
      const decoded = decode(scratch, n, dest.byteOffset + at + (done / 4) * 3, constants);
      done += decoded;
      if (decoded < n) break;
    }
    return done;
  };
}
