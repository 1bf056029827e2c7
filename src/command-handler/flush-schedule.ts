/**
 * When decisions leave for the store. A decision without a linger is sent from the next turn of the
 * event loop, with what lingers on other streams (the store's group commit takes all of it into one
 * batch); a lingering one waits up to its `lingerMs` for later decisions to leave with it. A caller
 * whose own write must go first steers the next send through `PendingAppends`.
 */
import type { Slot } from './slot.ts';

/** How a caller (the completion route, through metering) orders its own write against the pending appends. */
export interface PendingAppends {
  /**
   * Holds the decisions made so far for one more turn of the event loop, unless `sendNow` sends them
   * first: for a caller whose own write was queued for this turn after them (undici writes a request on
   * an idle kept-alive connection from a setImmediate), so that it goes before their encoding and append.
   */
  holdForOneTurn(): void;
  /**
   * Sends the decisions made so far to the store now, rather than at the end of the turn: for a caller
   * whose own writes of this turn went first (the engine call a reservation starts alongside its append).
   */
  sendNow(): void;
}

export class FlushSchedule implements PendingAppends {
  readonly #flush: (slot: Slot) => void;
  readonly #sendAppendsNow: () => void;
  /** Streams whose pending decisions linger (CommandOptions.lingerMs). */
  readonly #lingering = new Set<Slot>();
  /** Streams with decisions that may not linger, sent from the next turn (one setImmediate while any wait). */
  readonly #urgent = new Set<Slot>();
  /** The next urgent turn waits one more (`holdForOneTurn`). */
  #held = false;

  /** `flush` sends what is pending on one stream; `sendAppendsNow` has the store send what it was handed. */
  constructor(flush: (slot: Slot) => void, sendAppendsNow: () => void) {
    this.#flush = flush;
    this.#sendAppendsNow = sendAppendsNow;
  }

  /** A decision was queued on `slot`: plans its send (at the next turn, or after `lingerMs`). */
  schedule(slot: Slot, lingerMs: number): void {
    if (lingerMs <= 0) {
      // Sent from the next turn of the event loop, with what lingers on other streams (the store's
      // group commit takes all of it into this append's batch, one commit where there would have been
      // two: a key's settlement rides on the next request's reservation, whichever key that is). Not
      // at once: the caller's own work this turn (the engine call a reservation in a standing slot
      // lease starts) goes before the append's encoding.
      if (this.#urgent.size === 0) setImmediate(this.#urgentTurn);
      this.#urgent.add(slot);
    } else if (!slot.lingering) {
      slot.lingering = setTimeout(() => this.#flush(slot), lingerMs);
      this.#lingering.add(slot);
    }
  }

  /** The slot's pending decisions are being sent: it lingers no more. */
  sending(slot: Slot): void {
    if (slot.lingering) {
      clearTimeout(slot.lingering);
      slot.lingering = null;
      this.#lingering.delete(slot);
    }
  }

  holdForOneTurn(): void {
    if (this.#urgent.size > 0) this.#held = true;
  }

  sendNow(): void {
    this.#held = false;
    if (this.#urgent.size > 0) this.#flushUrgent();
    this.#sendAppendsNow();
  }

  /** The turn that sends what decisions without a linger left pending, unless held for one more (`holdForOneTurn`). */
  readonly #urgentTurn = (): void => {
    if (this.#held) {
      this.#held = false;
      setImmediate(this.#urgentTurn);
    } else if (this.#urgent.size > 0) this.#flushUrgent();
  };

  /** Sends what decisions without a linger left pending, and everything lingering with it. */
  #flushUrgent(): void {
    const urgent = [...this.#urgent];
    this.#urgent.clear();
    for (const other of this.#lingering) this.#flush(other);
    for (const slot of urgent) this.#flush(slot);
  }
}
