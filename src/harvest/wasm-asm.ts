// A few helpers to write WebAssembly modules instruction by instruction (no toolchain, no binary blob): the
// opcodes used, LEB128 numbers, sections, and a module of functions over one imported memory.
import { Buffer } from 'node:buffer';

/** The parts of WebAssembly used here (the project's TypeScript libraries do not declare it). */
export interface WasmMemory {
  readonly buffer: ArrayBuffer;
}
export interface WasmApi {
  Module: new (bytes: Uint8Array) => object;
  Instance: new (module: object, imports: object) => { exports: Record<string, unknown> };
  Memory: new (descriptor: { initial: number; maximum?: number }) => WasmMemory;
}
export const wasm = (globalThis as unknown as { WebAssembly: WasmApi }).WebAssembly;

export const I32 = 0x7f;
export const F64 = 0x7c;
export const V128 = 0x7b;
export const SIMD = 0xfd;
export const op = {
  block: 0x02,
  loop: 0x03,
  if: 0x04,
  else: 0x05,
  br_if: 0x0d,
  br: 0x0c,
  end: 0x0b,
  get: 0x20,
  set: 0x21,
  tee: 0x22,
  i32const: 0x41,
  i32add: 0x6a,
  i32sub: 0x6b,
  i32mul: 0x6c,
  i32shl: 0x74,
  i32shrU: 0x76,
  i32geu: 0x4f,
  i32gtU: 0x4b,
  i32ltu: 0x49,
  f64add: 0xa0,
  f64sqrt: 0x9f,
};
export const simd = {
  load: 0x00,
  load16x4u: 0x04,
  store: 0x0b,
  const: 0x0c,
  shuffle: 0x0d,
  swizzle: 0x0e,
  i8x16splat: 0x0f,
  i16x8splat: 0x10,
  i8x16eq: 0x23,
  i32x4splat: 0x11,
  f64x2extract: 0x21,
  i32x4gtS: 0x3b,
  and: 0x4e,
  or: 0x50,
  bitselect: 0x52,
  anyTrue: 0x53,
  store32lane: 0x5a,
  store64lane: 0x5b,
  promoteLow: 0x5f,
  i8x16shrU: 0x6d,
  i8x16add: 0x6e,
  i16x8narrowU: 0x86,
  i16x8shl: 0x8b,
  i16x8shrU: 0x8d,
  i32x4shl: 0xab,
  i32x4shrU: 0xad,
  i32x4add: 0xae,
  i32x4dotI16x8S: 0xba,
  f64x2add: 0xf0,
  f64x2sub: 0xf1,
  f64x2mul: 0xf2,
};

export function uleb(n: number): number[] {
  const out: number[] = [];
  do {
    let byte = n & 0x7f;
    n >>>= 7;
    if (n !== 0) byte |= 0x80;
    out.push(byte);
  } while (n !== 0);
  return out;
}
export function sleb(n: number): number[] {
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
export const section = (id: number, body: number[]) => [id, ...uleb(body.length), ...body];
export const vector = (items: number[][]) => [...uleb(items.length), ...items.flat()];
export const name = (s: string) => [...uleb(s.length), ...Buffer.from(s, 'utf8')];
export const s = (code: number) => [SIMD, ...uleb(code)];
export const memarg = (alignLog2: number, offset: number) => [...uleb(alignLog2), ...uleb(offset)];
export const get = (i: number) => [op.get, ...uleb(i)];
export const set = (i: number) => [op.set, ...uleb(i)];
export const i32 = (n: number) => [op.i32const, ...sleb(n)];export const bump = (ptr: number, by: number) => [...get(ptr), ...i32(by), op.i32add, ...set(ptr)];
/** A v128 constant of 16 bytes. */
export const v128 = (bytes: readonly number[]) => [...s(simd.const), ...bytes.map((b) => b & 0xff)];

/** A function of the module: its signature (value types), locals (groups of [count, type]) and body. */
export interface WasmFunction {
  name: string;
  params: number[];
  results: number[];
  locals: number[][];
  body: number[];
}

/** A module exporting `functions`, over one memory imported as env.memory. */
export function moduleOf(functions: WasmFunction[]): Uint8Array {
  const code = (f: WasmFunction) => {
    const bytes = [...vector(f.locals), ...f.body, op.end];
    return [...uleb(bytes.length), ...bytes];
  };
  return Uint8Array.from([
    0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00,
    ...section(1, vector(functions.map((f) => [0x60, ...vector(f.params.map((t) => [t])), ...vector(f.results.map((t) => [t]))]))),
    ...section(2, vector([[...name('env'), ...name('memory'), 0x02, 0x00, ...uleb(1)]])),
    ...section(3, vector(functions.map((_, i) => uleb(i)))),
    ...section(7, vector(functions.map((f, i) => [...name(f.name), 0x00, ...uleb(i)]))),
    ...section(10, vector(functions.map(code))),
  ]);
}

/**
 * The exports of `functions` over a memory, one instance per memory, compiled once; null where the module
 * does not compile (no WebAssembly SIMD).
 */
export function instancesOf(functions: () => WasmFunction[]): (memory: WasmMemory) => Record<string, unknown> | null {
  let compiled: object | null | undefined;
  const instances = new WeakMap<WasmMemory, Record<string, unknown>>();
  return (memory) => {
    if (compiled === undefined) {
      try {
        compiled = new wasm.Module(moduleOf(functions()));
      } catch {
        compiled = null;
      }
    }
    if (compiled === null) return null;
    let found = instances.get(memory);
    if (found === undefined) {
      found = new wasm.Instance(compiled, { env: { memory } }).exports;
      instances.set(memory, found);
    }
    return found;
  };
}

/** A memory of `pages` of 64 KiB that never grows (so views of it stay valid). */
export function fixedMemory(pages: number): WasmMemory {
  return new wasm.Memory({ initial: pages, maximum: pages });
}
