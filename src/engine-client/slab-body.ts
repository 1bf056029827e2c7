// A capture's response body held in slabs: buffers of a few MB from a per-process pool, reused from one
// capture to the next. A socket read into a new 64 KiB ArrayBuffer each time (undici) made every 11 MB
// capture 11 MB of external memory, and V8 starts a full collection once external memory allocated
// since the last one fills the old generation's room: a gateway relaying captures fell into a full GC
// per capture. The body's chunks are views of the slabs, so the slabs go back to the pool only once
// nothing reads those chunks any more (the client's response has closed: `recycle`).
import { Readable } from 'node:stream';
import type { BodySink } from './stream-post.ts';

const SLAB_BYTES = 4 * 1024 * 1024;
/** Free slabs kept for the next captures; the ones past this (after a large capture) are dropped. */
const KEPT_BYTES = 32 * 1024 * 1024;

export class SlabPool {
  /** Slabs made so far, and those lent out and not yet given back or dropped. */
  created = 0;
  lent = 0;
  readonly #free: Buffer[] = [];

  constructor(
    readonly slabBytes = SLAB_BYTES,
    readonly keptBytes = KEPT_BYTES,
  ) {}

  get free(): number {
    return this.#free.length;
  }

  take(): Buffer {
    this.lent++;
    const slab = this.#free.pop();
    if (slab !== undefined) return slab;
    this.created++;
    return Buffer.allocUnsafeSlow(this.slabBytes);
  }

  /** A slab nothing reads or writes any more. */
  give(slab: Buffer): void {
    this.lent--;
    if ((this.#free.length + 1) * this.slabBytes <= this.keptBytes) this.#free.push(slab);
  }
}

/** The process's pool for capture bodies. */
export const captureSlabs = new SlabPool();

/**
 * A response body as a Readable whose chunks are views of slabs it takes from `pool`: each piece read
 * from the connection is copied in after the last. Fed by `sink` (stream-post.ts); with backpressure.
 */
export class SlabBody extends Readable {
  readonly #pool: SlabPool;
  #slabs: Buffer[] = [];
  #used = 0;
  #reading: { pause(): void; resume(): void } | null = null;
  #paused = false;
  /** Called by `_destroy`: stops the exchange (no more pieces are copied). */
  onDestroy: () => void = () => {};
  readonly sink: BodySink;

  constructor(pool: SlabPool, head: (contentLength: number | null) => void) {
    super({ highWaterMark: 256 * 1024 });
    this.#pool = pool;
    this.sink = {
      head,
      chunk: (piece) => this.#add(piece),
      flow: (reading) => {
        this.#reading = reading;
        if (this.#paused) reading.pause();
      },
    };
  }

  #add(piece: Uint8Array): boolean {
    if (this.destroyed) return false;
    let fits = true;
    for (let at = 0; at < piece.length; ) {
      let slab = this.#slabs.at(-1);
      if (slab === undefined || this.#used === slab.length) {
        slab = this.#pool.take();
        this.#slabs.push(slab);
        this.#used = 0;
      }
      const n = Math.min(piece.length - at, slab.length - this.#used);
      slab.set(at === 0 && n === piece.length ? piece : piece.subarray(at, at + n), this.#used);
      fits = this.push(slab.subarray(this.#used, this.#used + n));
      this.#used += n;
      at += n;
    }
    if (!fits && !this.#paused) {
      this.#paused = true;
      this.#reading?.pause();
    }
    return true;
  }

  override _read(): void {
    if (!this.#paused) return;
    this.#paused = false;
    this.#reading?.resume();
  }

  override _destroy(error: Error | null, callback: (error?: Error | null) => void): void {
    this.onDestroy();
    callback(error);
  }

  /**
   * Ends the body and gives its slabs back to the pool: only once nothing reads its chunks any more
   * (the client's write of them is over). Later calls do nothing.
   */
  recycle(): void {
    this.destroy();
    for (const slab of this.#slabs) this.#pool.give(slab);
    this.#slabs = [];
  }
}
