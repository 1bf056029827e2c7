// Kernel memory: a fixed-size WebAssembly memory that capture buffers are decoded into and that the
// statistics kernel (stats-kernel.ts) is instantiated over, so RunningStats.add sums a capture where it
// lies, with no copy. It never grows (a grow would detach every view of it), so a view of it stays valid
// while anything holds it; regions are handed out first fit and given back by offset.
import { fixedMemory, type WasmMemory } from './wasm-asm.ts';

/** Regions start on 64-byte boundaries (a cache line; every typed view of them is aligned). */
const ALIGN = 64;
/** The most bytes of regions a kernel memory holds (with its scratch, offsets stay below 2^31). */
export const KERNEL_MEMORY_MAX = 2 ** 31 - 2 ** 16;
/** Bytes after the regions for text being decoded (base64-kernel.ts). */
export const SCRATCH_BYTES = 128 * 1024;

const registry = new WeakMap<ArrayBufferLike, KernelMemory>();
let made = 0;

export class KernelMemory {
  readonly memory: WasmMemory;
  readonly buffer: ArrayBuffer;
  /** Bytes handed out as regions; the scratch follows them. */
  readonly size: number;
  /** Offset of SCRATCH_BYTES that are no region's: where base64 text is copied to be decoded. */
  readonly scratch: number;
  /** Made after every kernel memory with a lower serial (a RunningStats moves only to a newer one). */
  readonly serial = ++made;
  readonly #free: { at: number; bytes: number }[];
  readonly #taken = new Map<number, number>();

  constructor(bytes: number) {
    const pages = Math.ceil(Math.min(Math.max(bytes, 1), KERNEL_MEMORY_MAX) / 65536);
    this.memory = fixedMemory(pages + SCRATCH_BYTES / 65536);
    this.buffer = this.memory.buffer;
    this.size = pages * 65536;
    this.scratch = this.size;
    this.#free = [{ at: 0, bytes: this.size }];
    registry.set(this.buffer, this);
  }

  /** The offset of a free region of `bytes`, or null when none is left that big. */
  alloc(bytes: number): number | null {
    const need = Math.ceil(Math.max(bytes, 1) / ALIGN) * ALIGN;
    const i = this.#free.findIndex((r) => r.bytes >= need);
    if (i < 0) return null;
    const region = this.#free[i];
    const at = region.at;
    if (region.bytes === need) this.#free.splice(i, 1);
    else this.#free[i] = { at: at + need, bytes: region.bytes - need };
    this.#taken.set(at, need);
    return at;
  }

  /** Gives back the region at `at` (an offset alloc returned; anything else is ignored). */
  release(at: number): void {
    const bytes = this.#taken.get(at);
    if (bytes === undefined) return;
    this.#taken.delete(at);
    let i = this.#free.findIndex((r) => r.at > at);
    if (i < 0) i = this.#free.length;
    this.#free.splice(i, 0, { at, bytes });
    // joined to its neighbours
    const next = this.#free[i + 1];
    if (next !== undefined && at + bytes === next.at) this.#free.splice(i, 2, { at, bytes: bytes + next.bytes });
    const prev = this.#free[i - 1];
    if (prev !== undefined && prev.at + prev.bytes === at) this.#free.splice(i - 1, 2, { at: prev.at, bytes: prev.bytes + this.#free[i].bytes });
  }

  /** Bytes not handed out. */
  get freeBytes(): number {
    return this.#free.reduce((n, r) => n + r.bytes, 0);
  }
}

/** The kernel memory `bytes` lie in, if any. */
export function kernelMemoryOf(bytes: ArrayBufferView): KernelMemory | undefined {
  return registry.get(bytes.buffer);
}
