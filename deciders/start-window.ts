/**
 * The request starts of a key's last minute as the meter's state holds them: epoch ms, oldest first.
 *
 * A window never changes once made (states are values: the command handler keeps the stored state and
 * the state with decisions still on their way side by side, and decides again from the former). It is
 * still cheap to extend, which the meter does at every reservation: windows share one backing array,
 * and the window that ends where that array ends extends it in place; any other window copies. Dropping
 * the starts older than a minute moves the window's start, copying nothing. A key at 600 starts a
 * minute copied its whole minute three times per reservation before.
 */
export class StartWindow {
  readonly #log: number[];
  readonly #from: number;
  readonly #to: number;

  private constructor(log: number[], from: number, to: number) {
    this.#log = log;
    this.#from = from;
    this.#to = to;
  }

  static readonly empty = new StartWindow([], 0, 0);

  /** A window of these starts, in any order. */
  static of(starts: readonly number[]): StartWindow {
    const log = [...starts].sort((a, b) => a - b);
    return new StartWindow(log, 0, log.length);
  }

  get size(): number {
    return this.#to - this.#from;
  }

  /** The `i`-th oldest start (0: the oldest). */
  at(i: number): number {
    if (i < 0 || i >= this.size) throw new RangeError(`start ${i} of a window of ${this.size}`);
    return this.#log[this.#from + i];
  }

  /** The starts later than `t`. */
  since(t: number): StartWindow {
    let lo = this.#from;
    let hi = this.#to;
    while (lo < hi) {
      const mid = (lo + hi) >>> 1;
      if (this.#log[mid] > t) hi = mid;
      else lo = mid + 1;
    }
    return lo === this.#from ? this : new StartWindow(this.#log, lo, this.#to);
  }

  /** This window and one more start (starts from several processes' clocks may come slightly out of order). */
  with(start: number): StartWindow {
    const log = this.#log;
    const last = this.size === 0 ? -Infinity : log[this.#to - 1];
    if (this.#to === log.length && start >= last) {
      // The tip of the shared array: no other window reads past #to, so pushing changes none of them.
      if (this.#from > 1024 && this.#from > log.length / 2) {
        const compacted = log.slice(this.#from);
        compacted.push(start);
        return new StartWindow(compacted, 0, compacted.length);
      }
      log.push(start);
      return new StartWindow(log, this.#from, this.#to + 1);
    }
    const copy = log.slice(this.#from, this.#to);
    let i = copy.length;
    while (i > 0 && copy[i - 1] > start) i--;
    copy.splice(i, 0, start);
    return new StartWindow(copy, 0, copy.length);
  }

  toArray(): number[] {
    return this.#log.slice(this.#from, this.#to);
  }

  /** As a JSON value: the starts (a state printed in a test's failure, say). */
  toJSON(): number[] {
    return this.toArray();
  }
}
