/**
 * Wake-up hints for readers of the global log. A hint says "something may have committed"; readers
 * re-read and fall back to polling, so a lost hint only delays them.
 */
export class WakeHub {
  #generation = 0;
  readonly #listeners = new Set<() => void>();

  get generation(): number {
    return this.#generation;
  }

  notify(): void {
    this.#generation += 1;
    for (const listener of this.#listeners) listener();
  }

  on(listener: () => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /** Resolves on the first hint after `seenGeneration` (at once if one came already) or after `timeoutMs`. */
  wait(seenGeneration: number, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    if (this.#generation !== seenGeneration || signal?.aborted) return Promise.resolve();
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        off();
        signal?.removeEventListener('abort', done);
        resolve();
      };
      const timer = setTimeout(done, timeoutMs);
      const off = this.on(done);
      signal?.addEventListener('abort', done, { once: true });
    });
  }
}
