/** What the metering service takes and gives: shared by its face (index.ts) and its modules. */
import type { KeyStatus, MeterCommand } from '../../deciders/index.ts';
import type { KeyBudgetValues, RequestFactsData } from '../../events/index.ts';

/** The key as metering needs it, read again at every (re)decision: the reservation re-check. */
export interface MeteredKey {
  keyId: string;
  status: KeyStatus;
  budgets: KeyBudgetValues;
}

export interface AdmitRequest {
  key: () => Promise<MeteredKey>;
  /** The key's id (the queue it waits in). */
  keyId: string;
  facts: RequestFactsData;
  inputTokens: number;
  maxTokens: number;
  maxTokensRequested: number | null;
  choices: number;
  limits: { maxActive: number; maxQueued: number; perMinute: number };
  /** The client left: a waiting request leaves the queue. */
  signal: AbortSignal;
}

export interface Reservation {
  readonly requestId: string;
  readonly keyId: string;
  /** The meter day (and stream) the hold is on. */
  readonly day: string;
  readonly stream: string;
  readonly maxTokens: number;
  /** The budget that lowered max_tokens, or null. */
  readonly clampedBy: string | null;
}

export interface Admission extends Reservation {
  /**
   * True when the reservation fits in this process's standing slot lease: the engine may be called
   * now, alongside the append (no byte may reach the client before `durable` resolves). False: call
   * it once `durable` resolves.
   */
  readonly startNow: boolean;
  /** Fires when this reservation was decided again and came out otherwise: cancel an engine call started on it. */
  readonly voiding: Voiding;
  /** The reservation as stored: this one, or the one decided again on fresh state (rejects with an ApiError). */
  readonly durable: Promise<Reservation>;
}

/**
 * Fires once, when a reservation decided in memory came out otherwise once stored. Not an AbortSignal:
 * every metered request has one, and a signal with its listeners cost some 25 µs of a metered
 * request's CPU (the route makes the one signal its early engine call needs; BENCHMARKS.md, gateway).
 */
export class Voiding {
  #voided = false;
  #listeners: (() => void)[] = [];

  get voided(): boolean {
    return this.#voided;
  }

  /** Calls `listener` once voided: at once if it is already. */
  onVoided(listener: () => void): void {
    if (this.#voided) listener();
    else this.#listeners.push(listener);
  }

  void(): void {
    if (this.#voided) return;
    this.#voided = true;
    const listeners = this.#listeners;
    this.#listeners = [];
    for (const listener of listeners) listener();
  }
}

/** What a settlement records besides the request's facts: the meter decider's Settle command, less its envelope. */
export type Usage = Omit<Extract<MeterCommand, { type: 'Settle' }>, 'type' | 'facts' | 'now'>;

/** What refused a request after authentication, for its record (RequestRejected.refused_by, retry_after_seconds). */
export interface Refusal {
  readonly refusedBy: string | null;
  readonly retryAfterSeconds: number | null;
}
export const noRefusal: Refusal = { refusedBy: null, retryAfterSeconds: null };
