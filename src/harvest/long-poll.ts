/**
 * `GET /v1/harvest/{job_id}?wait=S`: long-polls waiting in this process, capped per key and in all,
 * each woken when its job's stream changes (this process's commands, or another's seen on the log).
 */

export interface LongPoll {
  /** Resolves when the job changed, `ms` passed, or `signal` aborted, whichever comes first. */
  next(ms: number, signal: AbortSignal): Promise<void>;
  leave(): void;
}

export class LongPolls {
  readonly #perKey: number;
  readonly #total: number;
  readonly #byKey = new Map<string, number>();
  readonly #wakers = new Map<string, Set<() => void>>();
  #count = 0;

  constructor(caps: { perKey: number; total: number }) {
    this.#perKey = caps.perKey;
    this.#total = caps.total;
  }

  /** A place among the waiting long-polls, or null when the key's or the process's cap is reached (answer at once, declined). */
  enter(keyId: string, jobId: string): LongPoll | null {
    const mine = this.#byKey.get(keyId) ?? 0;
    if (mine >= this.#perKey || this.#count >= this.#total) return null;
    this.#byKey.set(keyId, mine + 1);
    this.#count++;
    let left = false;
    let wake: (() => void) | null = null;
    const wakers = this.#wakers.get(jobId) ?? new Set<() => void>();
    this.#wakers.set(jobId, wakers);
    let changed = false;
    const onChange = () => {
      changed = true;
      wake?.();
    };
    wakers.add(onChange);
    return {
      next: (ms, signal) =>
        new Promise<void>((resolve) => {
          if (changed || signal.aborted) {
            changed = false;
            return resolve();
          }
          const done = () => {
            clearTimeout(timer);
            signal.removeEventListener('abort', done);
            wake = null;
            changed = false;
            resolve();
          };
          const timer = setTimeout(done, ms);
          signal.addEventListener('abort', done, { once: true });
          wake = done;
        }),
      leave: () => {
        if (left) return;
        left = true;
        wake?.();
        wakers.delete(onChange);
        if (wakers.size === 0) this.#wakers.delete(jobId);
        this.#count--;
        const n = (this.#byKey.get(keyId) ?? 1) - 1;
        if (n === 0) this.#byKey.delete(keyId);
        else this.#byKey.set(keyId, n);
      },
    };
  }

  /** The job's stream changed: every long-poll on it looks again. */
  changed(jobId: string): void {
    for (const wake of this.#wakers.get(jobId) ?? []) wake();
  }

  /** Shutdown: every waiting long-poll answers now. */
  closeAll(): void {
    for (const wakers of this.#wakers.values()) for (const wake of wakers) wake();
  }
}
