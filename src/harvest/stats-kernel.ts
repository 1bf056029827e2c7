// The inner loops of a harvest's statistics and of a float32 capture's rounding, as a small WebAssembly
// SIMD module built here from its instructions (no toolchain, no binary blob), instantiated over any
// memory (a RunningStats' own, or the kernel memory capture buffers are decoded into: stats-memory.ts).
// `accumulate`: for each bf16 row of a layer it adds (y - shift) to the per-dimension sums and
// (y - shift)² to the squared sums, in float64, and the row's L2 norm to a running total. A layer's state
// is interleaved by groups of four dimensions, 96 bytes each: shift[4], sum[4], sum_sq[4] (float64), so
// one pointer walks it. Rows are summed two at a time (rows 0 and 1, 2 and 3, ...; an odd last row
// alone): sum += (a + b) and sum_sq += (a² + b²); four rows a pass keep the state in registers across
// both pairs. The same arithmetic in plain JavaScript (`jsRowsKernel`) gives the same bits: the pairs in
// the same order, and a row's squared norm summed in four interleaved lanes (d mod 4) added as
// (l0 + l1) + (l2 + l3), as the module's two f64x2 accumulators do.
import { bump, F64, fixedMemory, get, I32, i32, instancesOf, memarg, op, s, set, simd, uleb, V128, type WasmFunction, type WasmMemory } from './wasm-asm.ts';

export { fixedMemory, wasm, type WasmMemory } from './wasm-asm.ts';

/** Bytes of a layer's state per group of four dimensions: shift, sum and sum of squares, 4 float64 each. */
export const GROUP_BYTES = 96;

/** Rows of `width` bf16 values (width a multiple of 4) accumulated into per-dimension float64 sums. */
export interface RowsKernel {
  /**
   * Adds rows [src, src + rows × width × 2) of bf16 (byte offsets in `memory`) into the layer state at
   * `state` (width / 4 groups of GROUP_BYTES) as (y - shift) and (y - shift)²; returns `norm` plus each
   * row's L2 norm, in row order.
   */
  accumulate(src: number, rows: number, width: number, state: number, norm: number): number;
  /** Adds each of `rows` bf16 rows at `src` to the float64 sums at `dst` (width of them), row after row. */
  sumRows(src: number, rows: number, width: number, dst: number): void;
  readonly memory: WasmMemory;
}

// --- the module, instruction by instruction ---
const zero = [...s(simd.const), ...new Array(16).fill(0)];
const add = s(simd.f64x2add);
const sub = s(simd.f64x2sub);
const mul = s(simd.f64x2mul);
const square = (v: number) => [...get(v), ...get(v), ...mul];
/** Four bf16 at `ptr` as float64 pairs in `l` (the first two) and `h` (`bits` a scratch v128 local). */
const widen = (ptr: number, bits: number, l: number, h: number) => [
  ...get(ptr), ...s(simd.load16x4u), ...memarg(1, 0), ...i32(16), ...s(simd.i32x4shl), ...set(bits),
  ...get(bits), ...s(simd.promoteLow), ...set(l),
  ...get(bits), ...get(bits), ...s(simd.shuffle), 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, ...s(simd.promoteLow), ...set(h),
];

/** accumulate(src, rows, width, state, norm) -> norm */
function accumulateBody(): { locals: number[][]; body: number[] } {
  const [src, rows, width, state, norm] = [0, 1, 2, 3, 4];
  const [r, q, end, stride] = [5, 6, 7, 8];
  const ptr = [9, 10, 11, 12]; // i32: one pointer per row of a pass
  const v = 13; // v128 locals from here
  const acc = [v, v + 1, v + 2, v + 3, v + 4, v + 5, v + 6, v + 7]; // a row's squared norm: lanes 0-1, 2-3
  const dl = [v + 8, v + 9, v + 10, v + 11]; // (y - shift), dimensions 0-1 of the group, per row
  const dh = [v + 12, v + 13, v + 14, v + 15]; // dimensions 2-3
  const [lo, hi, bits, shl, shh] = [v + 16, v + 17, v + 18, v + 19, v + 20];
  // norm += sqrt((lane0 + lane1) + (lane2 + lane3)) of a row's accumulators
  const addNorm = (a0: number, a1: number) => [
    ...get(norm),
    ...get(a0), ...s(simd.f64x2extract), 0, ...get(a0), ...s(simd.f64x2extract), 1, op.f64add,
    ...get(a1), ...s(simd.f64x2extract), 0, ...get(a1), ...s(simd.f64x2extract), 1, op.f64add,
    op.f64add, op.f64sqrt, op.f64add, ...set(norm),
  ];
  // state part at `offset` (+ 16: the group's dimensions 2-3) += each pair's (x + y), or the lone row's x.
  const fold = (offset: number, ds: number[], sq: boolean) => {
    const term = (d: number) => (sq ? square(d) : get(d));
    const out = [...get(q), ...get(q), ...s(simd.load), ...memarg(3, offset)];
    for (let k = 0; k < ds.length; k += 2) out.push(...term(ds[k]), ...(k + 1 < ds.length ? [...term(ds[k + 1]), ...add] : []), ...add);
    return [...out, ...s(simd.store), ...memarg(3, offset)];
  };
  // `n` rows (4, 2 or 1) from ptr[0]: every group of four dimensions read once, the state once.
  const pass = (n: number) => {
    const rowsOf = [...Array(n).keys()];
    return [
      ...rowsOf.flatMap((k) => [...zero, ...set(acc[2 * k]), ...zero, ...set(acc[2 * k + 1])]),
      ...rowsOf.slice(1).flatMap((k) => [...get(ptr[k - 1]), ...get(stride), op.i32add, ...set(ptr[k])]),
      ...get(state), ...set(q),
      op.loop, 0x40,
      ...get(q), ...s(simd.load), ...memarg(3, 0), ...set(shl),
      ...get(q), ...s(simd.load), ...memarg(3, 16), ...set(shh),
      ...rowsOf.flatMap((k) => [
        ...widen(ptr[k], bits, lo, hi),
        ...get(acc[2 * k]), ...square(lo), ...add, ...set(acc[2 * k]),
        ...get(acc[2 * k + 1]), ...square(hi), ...add, ...set(acc[2 * k + 1]),
        ...get(lo), ...get(shl), ...sub, ...set(dl[k]),
        ...get(hi), ...get(shh), ...sub, ...set(dh[k]),
        ...bump(ptr[k], 8),
      ]),
      ...fold(32, dl.slice(0, n), false),
      ...fold(48, dh.slice(0, n), false),
      ...fold(64, dl.slice(0, n), true),
      ...fold(80, dh.slice(0, n), true),
      ...get(q), ...i32(GROUP_BYTES), op.i32add, op.tee, ...uleb(q), ...get(end), op.i32ltu, op.br_if, 0,
      op.end,
      ...rowsOf.flatMap((k) => addNorm(acc[2 * k], acc[2 * k + 1])),
      // the next pass starts after the last row of this one
      ...get(ptr[n - 1]), ...set(ptr[0]),
      ...get(r), ...i32(n), op.i32add, ...set(r),
    ];
  };
  const left = [...get(rows), ...get(r), op.i32sub];
  const body = [
    ...i32(0), ...set(r),
    ...get(src), ...set(ptr[0]),
    ...get(width), ...i32(1), op.i32shl, ...set(stride),
    ...get(state), ...get(width), ...i32(2), op.i32shrU, ...i32(GROUP_BYTES), op.i32mul, op.i32add, ...set(end),
    op.block, 0x40,
    op.loop, 0x40,
    ...left, ...i32(4), op.i32ltu, op.br_if, 1,
    ...pass(4),
    op.br, 0,
    op.end,
    op.end,
    ...left, ...i32(2), op.i32geu, op.if, 0x40, ...pass(2), op.end,
    ...left, ...i32(1), op.i32geu, op.if, 0x40, ...pass(1), op.end,
    ...get(norm),
  ];
  return { locals: [[...uleb(8), I32], [...uleb(21), V128]], body };
}

/** sumRows(src, rows, width, dst): dst[d] += row[d] (float64), row after row. */
function sumRowsBody(): { locals: number[][]; body: number[] } {
  const [src, rows, width, dst] = [0, 1, 2, 3];
  const [r, p, q, end] = [4, 5, 6, 7];
  const [bits, lo, hi] = [8, 9, 10];
  const body = [
    ...get(src), ...set(p),
    ...i32(0), ...set(r),
    ...get(dst), ...get(width), ...i32(3), op.i32shl, op.i32add, ...set(end),
    op.block, 0x40,
    op.loop, 0x40,
    ...get(r), ...get(rows), op.i32geu, op.br_if, 1,
    ...get(dst), ...set(q),
    op.loop, 0x40,
    ...widen(p, bits, lo, hi),
    ...get(q), ...get(q), ...s(simd.load), ...memarg(3, 0), ...get(lo), ...add, ...s(simd.store), ...memarg(3, 0),
    ...get(q), ...get(q), ...s(simd.load), ...memarg(3, 16), ...get(hi), ...add, ...s(simd.store), ...memarg(3, 16),
    ...bump(p, 8),
    ...get(q), ...i32(32), op.i32add, op.tee, ...uleb(q), ...get(end), op.i32ltu, op.br_if, 0,
    op.end,
    ...bump(r, 1),
    op.br, 0,
    op.end,
    op.end,
  ];
  return { locals: [[...uleb(4), I32], [...uleb(3), V128]], body };
}

/** f32ToBf16(src, count, dst): count (a multiple of 8) float32 words rounded to bf16, nearest even; a NaN stays a quiet NaN. */
function f32ToBf16Body(): { locals: number[][]; body: number[] } {
  const [src, count, dst] = [0, 1, 2];
  const [end] = [3];
  const [a, b, quiet, half, one, magnitude, inf] = [4, 5, 6, 7, 8, 9, 10];
  const constant = (local: number, n: number) => [...i32(n), ...s(simd.i32x4splat), ...set(local)];
  // one v128 of four words at `src + offset` -> four bf16 in the low halves of i32 lanes
  const round = (offset: number, into: number) => [
    ...get(src), ...s(simd.load), ...memarg(4, offset), ...set(into),
    // NaN: (w >>> 16) | 0x40
    ...get(into), ...i32(16), ...s(simd.i32x4shrU), ...get(quiet), ...s(simd.or),
    // else: (w + 0x7fff + ((w >>> 16) & 1)) >>> 16
    ...get(into), ...get(half), ...s(simd.i32x4add),
    ...get(into), ...i32(16), ...s(simd.i32x4shrU), ...get(one), ...s(simd.and), ...s(simd.i32x4add),
    ...i32(16), ...s(simd.i32x4shrU),
    // (w & 0x7fffffff) > 0x7f800000
    ...get(into), ...get(magnitude), ...s(simd.and), ...get(inf), ...s(simd.i32x4gtS),
    ...s(simd.bitselect), ...set(into),
  ];
  const body = [
    ...constant(quiet, 0x40), ...constant(half, 0x7fff), ...constant(one, 1), ...constant(magnitude, 0x7fffffff), ...constant(inf, 0x7f800000),
    ...get(src), ...get(count), ...i32(2), op.i32shl, op.i32add, ...set(end),
    op.block, 0x40,
    op.loop, 0x40,
    ...get(src), ...get(end), op.i32geu, op.br_if, 1,
    ...round(0, a), ...round(16, b),
    ...get(dst), ...get(a), ...get(b), ...s(simd.i16x8narrowU), ...s(simd.store), ...memarg(4, 0),
    ...bump(src, 32), ...bump(dst, 16),
    op.br, 0,
    op.end,
    op.end,
  ];
  return { locals: [[...uleb(1), I32], [...uleb(7), V128]], body };
}

const exportsOver = instancesOf((): WasmFunction[] => {
  const i = I32;
  return [
    { name: 'accumulate', params: [i, i, i, i, F64], results: [F64], ...accumulateBody() },
    { name: 'sumRows', params: [i, i, i, i], results: [], ...sumRowsBody() },
    { name: 'f32ToBf16', params: [i, i, i], results: [], ...f32ToBf16Body() },
  ];
});

/** The module's kernel over `memory`; null without WebAssembly SIMD. */
export function wasmRowsKernel(memory: WasmMemory): RowsKernel | null {
  const exports = exportsOver(memory);
  if (exports === null) return null;
  return { accumulate: exports.accumulate as RowsKernel['accumulate'], sumRows: exports.sumRows as RowsKernel['sumRows'], memory };
}

/** Rounds `count` float32 words at byte `src` of `memory` to bf16 at `dst` (count a multiple of 8); null without WebAssembly SIMD. */
export function wasmF32ToBf16(memory: WasmMemory): ((src: number, count: number, dst: number) => void) | null {
  return (exportsOver(memory)?.f32ToBf16 as (src: number, count: number, dst: number) => void) ?? null;
}

/** The same computation in JavaScript over the same memory layout, bit for bit (tests, and hosts without SIMD). */
export function jsRowsKernel(memory: WasmMemory): RowsKernel {
  const word = new Uint32Array(1);
  const value = new Float32Array(word.buffer);
  return {
    memory,
    accumulate(src, rows, width, state, norm) {
      const buf = memory.buffer;
      const bits = new Uint16Array(buf, src, rows * width);
      const st = new Float64Array(buf, state, (width / 4) * (GROUP_BYTES / 8));
      const bf16 = (i: number) => {
        word[0] = bits[i] << 16;
        return value[0];
      };
      for (let r = 0; r < rows; r += 2) {
        const pair = r + 1 < rows;
        const lanes = [0, 0, 0, 0];
        const lanes2 = [0, 0, 0, 0];
        for (let d = 0; d < width; d++) {
          const at = (d >> 2) * 12 + (d & 3);
          const y = bf16(r * width + d);
          lanes[d & 3] += y * y;
          const x = y - st[at];
          if (!pair) {
            st[at + 4] += x;
            st[at + 8] += x * x;
            continue;
          }
          const y2 = bf16((r + 1) * width + d);
          lanes2[d & 3] += y2 * y2;
          const x2 = y2 - st[at];
          st[at + 4] += x + x2;
          st[at + 8] += x * x + x2 * x2;
        }
        norm += Math.sqrt(lanes[0] + lanes[1] + (lanes[2] + lanes[3]));
        if (pair) norm += Math.sqrt(lanes2[0] + lanes2[1] + (lanes2[2] + lanes2[3]));
      }
      return norm;
    },
    sumRows(src, rows, width, dst) {
      const bits = new Uint16Array(memory.buffer, src, rows * width);
      const sums = new Float64Array(memory.buffer, dst, width);
      for (let i = 0; i < rows * width; i++) {
        word[0] = bits[i] << 16;
        sums[i % width] += value[0];
      }
    },
  };
}
