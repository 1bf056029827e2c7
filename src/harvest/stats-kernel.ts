// The inner loop of a harvest's statistics, as a small WebAssembly SIMD module built here from its
// instructions (no toolchain, no binary blob): for each bf16 row of a layer it adds (y - shift) to the
// per-dimension sums and (y - shift)² to the squared sums, in float64, and the row's L2 norm to a running
// total. A layer's state is interleaved by groups of four dimensions, 96 bytes each: shift[4], sum[4],
// sum_sq[4] (float64), so one pointer walks it. Rows are taken two at a time (rows 0 and 1, 2 and 3, ...;
// an odd last row alone), so the state is read and written once per pair: sum += (a + b) and
// sum_sq += (a² + b²). The same arithmetic in plain JavaScript (`jsRowsKernel`) gives the same bits: the
// pairs in the same order, and a row's squared norm summed in four interleaved lanes (d mod 4) added as
// (l0 + l1) + (l2 + l3), as the module's two f64x2 accumulators do.

/** Bytes of a layer's state per group of four dimensions: shift, sum and sum of squares, 4 float64 each. */
export const GROUP_BYTES = 96;

/** The parts of WebAssembly used here (the project's TypeScript libraries do not declare it). */
interface WasmMemory {
  readonly buffer: ArrayBuffer;
}
interface WasmApi {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object, imports: object) => { exports: Record<string, unknown> };
  Memory: new (descriptor: { initial: number }) => WasmMemory;
}
const wasm = (globalThis as unknown as { WebAssembly: WasmApi }).WebAssembly;

/** Rows of `width` bf16 values (width a multiple of 4) accumulated into per-dimension float64 sums. */
export interface RowsKernel {
  /**
   * Adds rows [src, src + rows × width × 2) of bf16 (byte offsets in `memory`) into the layer state at
   * `state` (width / 4 groups of GROUP_BYTES) as (y - shift) and (y - shift)²; returns `norm` plus each
   * row's L2 norm, in row order.
   */
  accumulate(src: number, rows: number, width: number, state: number, norm: number): number;
  readonly memory: WasmMemory;
}

// --- the module, instruction by instruction ---
const I32 = 0x7f;
const F64 = 0x7c;
const SIMD = 0xfd;
const op = {
  block: 0x02,
  loop: 0x03,
  br_if: 0x0d,
  br: 0x0c,
  end: 0x0b,
  get: 0x20,
  set: 0x21,
  tee: 0x22,
  i32const: 0x41,
  i32add: 0x6a,
  i32mul: 0x6c,
  i32geu: 0x4f,
  i32ltu: 0x49,
  f64add: 0xa0,
  f64sqrt: 0x9f,
};
const simd = {
  load: 0x00,
  load16x4u: 0x04,
  store: 0x0b,
  const: 0x0c,
  shuffle: 0x0d,
  f64x2extract: 0x21,
  promoteLow: 0x5f,
  i32x4shl: 0xab,
  f64x2add: 0xf0,
  f64x2sub: 0xf1,
  f64x2mul: 0xf2,
};

function uleb(n: number): number[] {
  const out: number[] = [];
  do {
    let byte = n & 0x7f;
    n >>>= 7;
    if (n !== 0) byte |= 0x80;
    out.push(byte);
  } while (n !== 0);
  return out;
}
function sleb(n: number): number[] {
  const out: number[] = [];
  for (;;) {
    const byte = n & 0x7f;
    n >>= 7;
    if ((n === 0 && (byte & 0x40) === 0) || (n === -1 && (byte & 0x40) !== 0)) {
      out.push(byte);
      return out;
    }
    out.push(byte | 0x80);
  }
}
const section = (id: number, body: number[]) => [id, ...uleb(body.length), ...body];
const vector = (items: number[][]) => [...uleb(items.length), ...items.flat()];
const name = (s: string) => [...uleb(s.length), ...Buffer.from(s, 'utf8')];
const s = (code: number) => [SIMD, ...uleb(code)];
const memarg = (alignLog2: number, offset: number) => [...uleb(alignLog2), ...uleb(offset)];

function moduleBytes(): Uint8Array {
  // params: 0 src, 1 rows, 2 width, 3 state (i32), 4 norm (f64); locals below.
  const [src, rows, width, state, norm] = [0, 1, 2, 3, 4];
  const [r, q, end, p, p2] = [5, 6, 7, 8, 9]; // i32 locals
  const [acc0, acc1, acc2, acc3, lo, hi, lo2, hi2, dl, dh, dl2, dh2, bits] = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]; // v128 locals
  const get = (i: number) => [op.get, ...uleb(i)];
  const set = (i: number) => [op.set, ...uleb(i)];
  const i32 = (n: number) => [op.i32const, ...sleb(n)];
  const zero = [...s(simd.const), ...new Array(16).fill(0)];
  const add = s(simd.f64x2add);
  const sub = s(simd.f64x2sub);
  const mul = s(simd.f64x2mul);
  const square = (v: number) => [...get(v), ...get(v), ...mul];
  // v128 at q + offset (aligned to 8); q walks the state a group at a time.
  const loadAt = (offset: number) => [...get(q), ...s(simd.load), ...memarg(3, offset)];
  const addInto = (offset: number, value: number[]) => [...get(q), ...loadAt(offset), ...value, ...add, ...s(simd.store), ...memarg(3, offset)];
  // Four bf16 values at `ptr` widened to float64 in `l` (the first two) and `h`; their squares added to the row's lanes.
  const loadRow = (ptr: number, l: number, h: number, a0: number, a1: number) => [
    ...get(ptr), ...s(simd.load16x4u), ...memarg(1, 0), ...i32(16), ...s(simd.i32x4shl), ...set(bits),
    ...get(bits), ...s(simd.promoteLow), ...set(l),
    ...get(bits), ...get(bits), ...s(simd.shuffle), 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, ...s(simd.promoteLow), ...set(h),
    ...get(a0), ...square(l), ...add, ...set(a0),
    ...get(a1), ...square(h), ...add, ...set(a1),
  ];
  // norm += sqrt((lane0 + lane1) + (lane2 + lane3)) of a row's accumulators
  const addNorm = (a0: number, a1: number) => [
    ...get(norm),
    ...get(a0), ...s(simd.f64x2extract), 0, ...get(a0), ...s(simd.f64x2extract), 1, op.f64add,
    ...get(a1), ...s(simd.f64x2extract), 0, ...get(a1), ...s(simd.f64x2extract), 1, op.f64add,
    op.f64add, op.f64sqrt, op.f64add, ...set(norm),
  ];
  const nextGroup = [...get(q), ...i32(GROUP_BYTES), op.i32add, op.tee, ...uleb(q), ...get(end), op.i32ltu, op.br_if, 0];
  const step = (ptr: number) => [...get(ptr), ...i32(8), op.i32add, ...set(ptr)];
  // Two rows at a time (the state is read and written once for both): sum += (a + b), sum_sq += (a² + b²).
  const paired = [
    ...zero, ...set(acc0), ...zero, ...set(acc1), ...zero, ...set(acc2), ...zero, ...set(acc3),
    ...get(state), ...set(q),
    ...get(p), ...get(width), ...i32(2), op.i32mul, op.i32add, ...set(p2),
    op.loop, 0x40,
    ...loadRow(p, lo, hi, acc0, acc1),
    ...loadRow(p2, lo2, hi2, acc2, acc3),
    ...get(lo), ...loadAt(0), ...sub, ...set(dl),
    ...get(hi), ...loadAt(16), ...sub, ...set(dh),
    ...get(lo2), ...loadAt(0), ...sub, ...set(dl2),
    ...get(hi2), ...loadAt(16), ...sub, ...set(dh2),
    ...addInto(32, [...get(dl), ...get(dl2), ...add]),
    ...addInto(48, [...get(dh), ...get(dh2), ...add]),
    ...addInto(64, [...square(dl), ...square(dl2), ...add]),
    ...addInto(80, [...square(dh), ...square(dh2), ...add]),
    ...step(p), ...step(p2),
    ...nextGroup,
    op.end,
    ...addNorm(acc0, acc1),
    ...addNorm(acc2, acc3),
    ...get(p2), ...set(p),
    ...get(r), ...i32(2), op.i32add, ...set(r),
  ];
  // The last row of an odd count, alone: sum += a, sum_sq += a².
  const single = [
    ...zero, ...set(acc0), ...zero, ...set(acc1),
    ...get(state), ...set(q),
    op.loop, 0x40,
    ...loadRow(p, lo, hi, acc0, acc1),
    ...get(lo), ...loadAt(0), ...sub, ...set(dl),
    ...get(hi), ...loadAt(16), ...sub, ...set(dh),
    ...addInto(32, get(dl)),
    ...addInto(48, get(dh)),
    ...addInto(64, square(dl)),
    ...addInto(80, square(dh)),
    ...step(p),
    ...nextGroup,
    op.end,
    ...addNorm(acc0, acc1),
    ...get(r), ...i32(1), op.i32add, ...set(r),
  ];
  const body = [
    ...i32(0), ...set(r),
    ...get(src), ...set(p),
    ...get(state), ...get(width), ...i32(4), 0x6e /* i32.div_u */, ...i32(GROUP_BYTES), op.i32mul, op.i32add, ...set(end),
    op.block, 0x40,
    op.loop, 0x40,
    ...get(r), ...get(rows), op.i32geu, op.br_if, 1,
    ...get(r), ...i32(1), op.i32add, ...get(rows), op.i32ltu,
    0x04, 0x40, // if: two rows left at least
    ...paired,
    0x05, // else
    ...single,
    op.end,
    op.br, 0,
    op.end,
    op.end,
    ...get(norm),
    op.end,
  ];
  const locals = vector([[...uleb(5), I32], [...uleb(13), 0x7b]]);
  const code = [...locals, ...body];
  return Uint8Array.from([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    ...section(1, vector([[0x60, ...vector([[I32], [I32], [I32], [I32], [F64]]), ...vector([[F64]])]])),
    ...section(2, vector([[...name('env'), ...name('memory'), 0x02, 0x00, ...uleb(1)]])),
    ...section(3, vector([[0x00]])),
    ...section(7, vector([[...name('accumulate'), 0x00, 0x00]])),
    ...section(10, vector([[...uleb(code.length), ...code]])),
  ]);
}

let compiled: object | null | undefined;

/** The compiled module, or null where WebAssembly SIMD is not available (the JavaScript loop is used then). */
function kernelModule(): object | null {
  if (compiled === undefined) {
    try {
      compiled = new wasm.Module(moduleBytes());
    } catch {
      compiled = null;
    }
  }
  return compiled;
}

/** A kernel over a memory of its own (`pages` of 64 KiB to start); null without WebAssembly SIMD. */
export function wasmRowsKernel(pages: number): RowsKernel | null {
  const mod = kernelModule();
  if (mod === null) return null;
  const memory = new wasm.Memory({ initial: pages });
  const instance = new wasm.Instance(mod, { env: { memory } });
  const accumulate = instance.exports.accumulate as RowsKernel['accumulate'];
  return { accumulate, memory };
}

/** The same computation in JavaScript over the same memory layout, bit for bit (tests, and hosts without SIMD). */
export function jsRowsKernel(pages: number): RowsKernel {
  const memory = new wasm.Memory({ initial: pages });
  return {
    memory,
    accumulate(src, rows, width, state, norm) {
      const buf = memory.buffer;
      const bits = new Uint16Array(buf, src, rows * width);
      const st = new Float64Array(buf, state, (width / 4) * (GROUP_BYTES / 8));
      const word = new Uint32Array(1);
      const value = new Float32Array(word.buffer);
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
  };
}
