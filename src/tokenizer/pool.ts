// Tokenization off the event loop: a request's text prompts above OFF_THREAD_UNITS in total are tokenized in a
// small pool of worker threads (thread.ts), so one long prompt does not hold up every other request. Smaller
// ones are tokenized in place, where a thread's round trip would cost more than the work.
import { availableParallelism } from 'node:os';
import { Worker } from 'node:worker_threads';
import type { Tokenizer, TokenizerSpec } from './types.ts';
import type { PoolJob, TokenizeReply } from './thread.ts';

/**
 * Text prompts longer than this in total (UTF-16 code units) are tokenized in the pool. Below it a request's
 * tokenization holds the event loop a few milliseconds for most text, a few tens at worst (a long run of one
 * letter through a Hugging Face BPE: `npm run bench -- tokenize`).
 */
export const OFF_THREAD_UNITS = 8192;
/** JSON bodies larger than this (bytes) are parsed in the pool: JSON.parse takes a few ms a megabyte. */
export const OFF_THREAD_JSON_BYTES = 1024 * 1024;

export class TokenizerThreadError extends Error {
  override name = 'TokenizerThreadError';
}

interface Thread {
  worker: Worker;
  pending: Map<number, { resolve: (reply: TokenizeReply) => void; reject: (err: Error) => void }>;
}

/**
 * A few tokenizer threads, started on first use; each loads a model's tokenizer the first time it is asked for
 * it. A job goes to the thread with the fewest jobs waiting. Idle threads do not keep the process alive.
 */
export class TokenizerPool {
  readonly #size: number;
  readonly #threads: Thread[] = [];
  #next = 0;
  #closed = false;

  /** `size`: threads at most (default: one per core beyond the first, one to two). */
  constructor(size = Math.min(2, Math.max(1, availableParallelism() - 1))) {
    this.#size = size;
  }

  /** `encode(text, addSpecialTokens).length` of each text, as the spec's tokenizer counts it. */
  async count(spec: TokenizerSpec, texts: string[], addSpecialTokens: boolean): Promise<number[]> {
    const reply = await this.#run({ spec, texts, addSpecialTokens, want: 'counts' });
    return (reply as { counts: number[] }).counts;
  }

  /** `encode(text, addSpecialTokens)` of each text. */
  async encode(spec: TokenizerSpec, texts: string[], addSpecialTokens: boolean): Promise<number[][]> {
    const reply = await this.#run({ spec, texts, addSpecialTokens, want: 'ids' });
    return (reply as { ids: Int32Array[] }).ids.map((a) => Array.from(a));
  }

  /** `JSON.parse` of the UTF-8 bytes (copied to the thread; the caller keeps them). Rejects on malformed JSON. */
  async parseJson(bytes: Uint8Array): Promise<unknown> {
    const reply = await this.#run({ want: 'json', bytes });
    if ('error' in reply) throw new SyntaxError(reply.error);
    return (reply as { value: unknown }).value;
  }

  /** Stops the threads; jobs in flight are rejected. */
  async close(): Promise<void> {
    this.#closed = true;
    const threads = this.#threads.splice(0);
    await Promise.all(threads.map((t) => t.worker.terminate()));
  }

  #run(job: DistributiveOmit<PoolJob, 'id'>): Promise<TokenizeReply> {
    if (this.#closed) return Promise.reject(new TokenizerThreadError('the tokenizer pool is closed'));
    const thread = this.#pick();
    const id = this.#next++;
    return new Promise<TokenizeReply>((resolve, reject) => {
      thread.pending.set(id, { resolve, reject });
      thread.worker.ref();
      thread.worker.postMessage({ ...job, id } as PoolJob);
    }).then((reply) => {
      if ('error' in reply && job.want !== 'json') throw new TokenizerThreadError(`tokenizing in a worker thread failed: ${reply.error}`);
      return reply;
    });
  }

  #pick(): Thread {
    const idle = this.#threads.find((t) => t.pending.size === 0);
    if (idle) return idle;
    if (this.#threads.length < this.#size) return this.#start();
    return this.#threads.reduce((a, b) => (b.pending.size < a.pending.size ? b : a));
  }

  #start(): Thread {
    // A build runs thread.js beside this file. Under tsx (tests, benches) the sources run as they are, and a
    // worker needs tsx's loader registered in it first (Node 20 workers do not inherit the parent's).
    const worker = import.meta.url.endsWith('.ts')
      ? new Worker(`import(${JSON.stringify(import.meta.resolve('tsx/esm/api'))}).then((tsx) => { tsx.register(); return import(${JSON.stringify(new URL('./thread.ts', import.meta.url).href)}); });`, { eval: true })
      : new Worker(new URL('./thread.js', import.meta.url));
    worker.unref();
    const thread: Thread = { worker, pending: new Map() };
    worker.on('message', (reply: TokenizeReply) => {
      const waiting = thread.pending.get(reply.id);
      thread.pending.delete(reply.id);
      if (thread.pending.size === 0) worker.unref();
      waiting?.resolve(reply);
    });
    const lost = (err: Error) => {
      const at = this.#threads.indexOf(thread);
      if (at >= 0) this.#threads.splice(at, 1);
      for (const waiting of thread.pending.values()) waiting.reject(err);
      thread.pending.clear();
    };
    worker.on('error', (err) => lost(new TokenizerThreadError(`a tokenizer thread failed: ${err.message}`)));
    worker.on('exit', (code) => lost(new TokenizerThreadError(`a tokenizer thread exited with ${code}`)));
    this.#threads.push(thread);
    return thread;
  }
}

/** Token counts of `texts`: in the pool when there is one and they are long, otherwise in place. */
export function countTokens(pool: TokenizerPool | undefined, spec: TokenizerSpec, tokenizer: Tokenizer, texts: string[], addSpecialTokens: boolean): number[] | Promise<number[]> {
  if (pool && unitsOf(texts) > OFF_THREAD_UNITS) return pool.count(spec, texts, addSpecialTokens);
  return texts.map((text) => tokenizer.encode(text, addSpecialTokens).length);
}

/** Token ids of `texts`: in the pool when there is one and they are long, otherwise in place. */
export async function encodeTexts(pool: TokenizerPool | undefined, spec: TokenizerSpec, tokenizer: Tokenizer, texts: string[], addSpecialTokens: boolean): Promise<number[][]> {
  if (pool && unitsOf(texts) > OFF_THREAD_UNITS) return pool.encode(spec, texts, addSpecialTokens);
  return texts.map((text) => tokenizer.encode(text, addSpecialTokens));
}

type DistributiveOmit<T, K extends keyof T> = T extends unknown ? Omit<T, K> : never;

function unitsOf(texts: string[]): number {
  let units = 0;
  for (const text of texts) units += text.length;
  return units;
}
