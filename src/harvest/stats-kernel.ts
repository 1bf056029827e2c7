// The inner loop of a harvest's statistics, as a small WebAssembly SIMD module built here from its
// instructions (no toolchain, no binary blob): for each bf16 row of a layer it adds (y - shift) to the
// row sums and (y - shift)² to the squared sums, in float64, and the row's L2 norm to a running total.
// The same arithmetic in plain JavaScript (`accumulateRowsJs`) gives the same bits: every per-dimension
// sum is updated row after row, and a row's squared norm is summed in four interleaved lanes
// (d mod 4) added as (l0 + l1) + (l2 + l3), as the module's two f64x2 accumulators do.

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
   * Adds rows [src, src + rows × width × 2) of bf16 (byte offsets in `memory`) into `s1` and `s2`
   * (float64 × width each) as (y - shift) and (y - shift)²; returns `norm` plus each row's L2 norm, in row order.
   */
  accumulate(src: number, rows: number, width: number, shift: number, s1: number, s2: number, norm: number): number;
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
  // params: 0 src, 1 rows, 2 width, 3 shift, 4 s1, 5 s2 (i32), 6 norm (f64); locals below.
  const [src, rows, width, shift, s1, s2, norm] = [0, 1, 2, 3, 4, 5, 6];
  const [r, j, end, p] = [7, 8, 9, 10]; // i32 locals
  const [acc0, acc1, lo, hi, dl, dh, bits] = [11, 12, 13, 14, 15, 16, 17]; // v128 locals
  const get = (i: number) => [op.get, ...uleb(i)];
  const set = (i: number) => [op.set, ...uleb(i)];
  const i32 = (n: number) => [op.i32const, ...sleb(n)];
  const zero = [...s(simd.const), ...new Array(16).fill(0)];
  // v128 at (base + j + offset), aligned to 8.
  const loadAt = (base: number, offset: number) => [...get(base), ...get(j), op.i32add, ...s(simd.load), ...memarg(3, offset)];
  const addInto = (base: number, offset: number, value: number[]) => [...get(base), ...get(j), op.i32add, ...loadAt(base, offset), ...value, ...s(simd.f64x2add), ...s(simd.store), ...memarg(3, offset)];
  const body = [
    // rows loop
    ...i32(0), ...set(r),
    op.block, 0x40,
    op.loop, 0x40,
    ...get(r), ...get(rows), op.i32geu, op.br_if, 1,
    ...zero, ...set(acc0),
    ...zero, ...set(acc1),
    ...get(src), ...get(r), ...get(width), op.i32mul, ...i32(2), op.i32mul, op.i32add, ...set(p),
    ...i32(0), ...set(j),
    ...get(width), ...i32(8), op.i32mul, ...set(end),
    // dims loop: four bf16 values a step (p += 8 bytes, j += 32 bytes of float64)
    op.loop, 0x40,
    ...get(p), ...s(simd.load16x4u), ...memarg(1, 0), ...i32(16), ...s(simd.i32x4shl), ...set(bits),
    ...get(bits), ...s(simd.promoteLow), ...set(lo),
    ...get(bits), ...get(bits), ...s(simd.shuffle), 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, ...s(simd.promoteLow), ...set(hi),
    ...get(acc0), ...get(lo), ...get(lo), ...s(simd.f64x2mul), ...s(simd.f64x2add), ...set(acc0),
    ...get(acc1), ...get(hi), ...get(hi), ...s(simd.f64x2mul), ...s(simd.f64x2add), ...set(acc1),
    ...get(lo), ...loadAt(shift, 0), ...s(simd.f64x2sub), ...set(dl),
    ...get(hi), ...loadAt(shift, 16), ...s(simd.f64x2sub), ...set(dh),
    ...addInto(s1, 0, get(dl)),
    ...addInto(s1, 16, get(dh)),
    ...addInto(s2, 0, [...get(dl), ...get(dl), ...s(simd.f64x2mul)]),
    ...addInto(s2, 16, [...get(dh), ...get(dh), ...s(simd.f64x2mul)]),
    ...get(p), ...i32(8), op.i32add, ...set(p),
    ...get(j), ...i32(32), op.i32add, op.tee, ...uleb(j), ...get(end), op.i32ltu, op.br_if, 0,
    op.end,
    // norm += sqrt((lane0 + lane1) + (lane2 + lane3))
    ...get(norm),
    ...get(acc0), ...s(simd.f64x2extract), 0, ...get(acc0), ...s(simd.f64x2extract), 1, op.f64add,
    ...get(acc1), ...s(simd.f64x2extract), 0, ...get(acc1), ...s(simd.f64x2extract), 1, op.f64add,
    op.f64add, op.f64sqrt, op.f64add, ...set(norm),
    ...get(r), ...i32(1), op.i32add, ...set(r),
    op.br, 0,
    op.end,
    op.end,
    ...get(norm),
    op.end,
  ];
  const locals = vector([[...uleb(4), I32], [...uleb(7), 0x7b]]);
  const code = [...locals, ...body];
  return Uint8Array.from([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    ...section(1, vector([[0x60, ...vector([[I32], [I32], [I32], [I32], [I32], [I32], [F64]]), ...vector([[F64]])]])),
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
    accumulate(src, rows, width, shift, s1, s2, norm) {
      const buf = memory.buffer;
      const bits = new Uint16Array(buf, src, rows * width);
      const k = new Float64Array(buf, shift, width);
      const a = new Float64Array(buf, s1, width);
      const b = new Float64Array(buf, s2, width);
      const word = new Uint32Array(1);
      const value = new Float32Array(word.buffer);
      for (let r = 0; r < rows; r++) {
        const lanes = [0, 0, 0, 0];
        for (let d = 0; d < width; d++) {
          word[0] = bits[r * width + d] << 16;
          const y = value[0];
          lanes[d & 3] += y * y;
          const x = y - k[d];
          a[d] += x;
          b[d] += x * x;
        }
        norm += Math.sqrt(lanes[0] + lanes[1] + (lanes[2] + lanes[3]));
      }
      return norm;
    },
  };
}
