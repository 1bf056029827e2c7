// sha256 of a file read back from disk (the page cache), in a thread of its own: a shard's header is
// written last, so its bytes are never written in order to hash on the way.
import { Worker } from 'node:worker_threads';

/** Piece of a file read back to hash it. */
const HASH_PIECE = 4 * 1024 * 1024;

// sha256 of a file in a thread of its own, so that the main thread goes on decoding the next captures
// meanwhile (hashing costs about as much CPU as decoding base64). CommonJS evaluated as is: no loader.
const HASHER_SOURCE = `
const { parentPort } = require('node:worker_threads');
const { createHash } = require('node:crypto');
const { openSync, readSync, closeSync, constants } = require('node:fs');
// aligned (a WebAssembly memory starts on a 64 KiB boundary), for reads around the page cache
const piece = Buffer.from(new WebAssembly.Memory({ initial: ${HASH_PIECE / 65536}, maximum: ${HASH_PIECE / 65536} }).buffer);
function hashOf(path, size, aligned) {
  const fd = aligned ? openSync(path, constants.O_RDONLY | constants.O_DIRECT) : openSync(path, 'r');
  try {
    const hash = createHash('sha256');
    for (let at = 0; at < size; ) {
      const want = Math.min(piece.length, size - at);
      const n = Math.min(readSync(fd, piece, 0, aligned ? Math.ceil(want / 4096) * 4096 : want, at), want);
      if (n === 0) throw new Error('the file ended at ' + at + ' bytes; ' + size + ' were written');
      hash.update(piece.subarray(0, n));
      at += n;
    }
    return hash.digest('hex');
  } finally {
    closeSync(fd);
  }
}
parentPort.on('message', ({ id, path, size, direct }) => {
  try {
    let sha256 = null;
    // around the page cache where the file system allows it, else (or on any failure) through it
    if (direct && constants.O_DIRECT !== undefined) {
      try {
        sha256 = hashOf(path, size, true);
      } catch {}
    }
    parentPort.postMessage({ id, sha256: sha256 ?? hashOf(path, size, false) });
  } catch (err) {
    parentPort.postMessage({ id, error: String((err && err.message) || err) });
  }
});
`;

/** One hashing thread per process, started on first use; it keeps the process alive only while it hashes. */
class FileHasher {
  #worker: Worker | null = null;
  readonly #pending = new Map<number, { resolve: (sha256: string) => void; reject: (err: Error) => void }>();
  #next = 0;

  /** sha256 (hex) of the first `size` bytes of the file at `path` (`direct`: read around the page cache where the file system allows). */
  hash(path: string, size: number, direct = false): Promise<string> {
    const worker = this.#worker ?? this.#start();
    const id = this.#next++;
    return new Promise((resolve, reject) => {
      this.#pending.set(id, { resolve, reject });
      worker.ref();
      worker.postMessage({ id, path, size, direct });
    });
  }

  #start(): Worker {
    const worker = new Worker(HASHER_SOURCE, { eval: true, execArgv: [] });
    worker.unref();
    worker.on('message', (reply: { id: number; sha256?: string; error?: string }) => {
      const waiting = this.#pending.get(reply.id);
      this.#pending.delete(reply.id);
      if (this.#pending.size === 0) worker.unref();
      if (reply.error !== undefined) waiting?.reject(new Error(reply.error));
      else waiting?.resolve(reply.sha256!);
    });
    worker.on('error', (err) => this.#lost(worker, err));
    worker.on('exit', (code) => this.#lost(worker, new Error(`the hashing thread exited with ${code}`)));
    this.#worker = worker;
    return worker;
  }

  #lost(worker: Worker, err: Error): void {
    if (this.#worker !== worker) return;
    this.#worker = null;
    for (const waiting of this.#pending.values()) waiting.reject(err);
    this.#pending.clear();
  }
}

const hasher = new FileHasher();

/**
 * sha256 (hex) of the first `size` bytes of the file at `path`, read and hashed in the hashing thread;
 * `direct`: read with O_DIRECT (a file written around the page cache is not read into it), 4 MiB at a time.
 */
export function hashFile(path: string, size: number, direct = false): Promise<string> {
  return hasher.hash(path, size, direct);
}
