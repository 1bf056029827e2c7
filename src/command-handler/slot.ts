/**
 * What the handler keeps per stream (a slot) and per command under way (an entry), and the decision
 * handed back for each: internal to the command handler.
 */
import type { Decider, DomainEvent, Rejection } from '../event-sourcing/index.ts';
import type { CommandOptions, Outcome, PendingDecision } from './types.ts';

export type AnyOutcome = Outcome<unknown, DomainEvent, Rejection>;

export interface Entry {
  readonly command: unknown;
  readonly commandId: string;
  readonly options: CommandOptions;
  outcome: AnyOutcome;
  /** Made when a caller first asks for the `superseded` signal (most never do). */
  controller: AbortController | null;
  /** Why the decision turned out void, once it did. */
  voided: { reason: unknown } | null;
  attempts: number;
  resolve(outcome: AnyOutcome): void;
  reject(error: unknown): void;
}

export interface Stored {
  version: number;
  events: DomainEvent[];
}

export interface Slot {
  readonly streamId: string;
  readonly decider: Decider<unknown, unknown, DomainEvent, Rejection>;
  /** What the store holds, as far as this process knows. */
  confirmed: { state: unknown; version: number };
  /** `confirmed` plus every decision still on its way to the store. */
  latest: { state: unknown; version: number };
  /** Remembered command ids (`ResendIds.remember`): stored (with their events) or still under way (their entry). */
  readonly recent: Map<string, Stored | Entry>;
  inflight: Entry[] | null;
  pending: Entry[];
  /** Set while the slot reads what it missed; decisions wait for it. */
  catchingUp: Promise<void> | null;
  /** Another writer may have changed the stream: catch up before the next decision. */
  stale: boolean;
  /** Pending decisions that may linger (CommandOptions.lingerMs) leave when this fires, or with the next decision (on any stream) that may not. */
  lingering: NodeJS.Timeout | null;
  /** Conflicts since this slot's last stored append. */
  conflicts: number;
}

/** A slot with nothing under way: no append in flight, nothing pending, not catching up. */
export function idle(slot: Slot): boolean {
  return !slot.inflight && slot.pending.length === 0 && !slot.catchingUp;
}

/** The reason a decision's `superseded` signal fires. */
export class DecisionSuperseded extends Error {
  override name = 'DecisionSuperseded';
  constructor(readonly streamId: string) {
    super(`another process changed stream ${streamId} first; the command was decided again`);
  }
}

export const neverSuperseded = new AbortController().signal;

/**
 * A decision under way, as `decide` returns it. A class, for its getter: an object literal with a
 * getter (`{ get superseded() { ... } }`) takes a hidden class of its own each time it is made, made in
 * V8's old generation, and that keeps the whole decision (its command, events, the caller's closures)
 * alive through every scavenge until the next full collection. That was about 1 KB promoted per
 * command, and most of a metered request's scavenge cost (BENCHMARKS.md, gateway).
 */
export class Decision implements PendingDecision<unknown, DomainEvent, Rejection> {
  readonly #entry: Entry;
  constructor(
    readonly outcome: AnyOutcome,
    readonly durable: Promise<AnyOutcome>,
    entry: Entry,
  ) {
    this.#entry = entry;
  }

  get superseded(): AbortSignal {
    return supersededSignal(this.#entry);
  }
}

/** The entry's `superseded` signal, made on first use (aborted at once if the decision was voided already). */
function supersededSignal(entry: Entry): AbortSignal {
  if (!entry.controller) {
    entry.controller = new AbortController();
    if (entry.voided) entry.controller.abort(entry.voided.reason);
  }
  return entry.controller.signal;
}

export function supersede(entry: Entry, reason: unknown): void {
  if (entry.voided) return;
  entry.voided = { reason };
  entry.controller?.abort(reason);
}

/** Whether the entry's outcome appends events (a rejection or a no-op does not); made into stored form when sent (`toAppend`). */
export function appends(entry: Entry): boolean {
  return entry.outcome.accepted && entry.outcome.newEvents.length > 0;
}

export function durableOf(entry: Entry): Promise<AnyOutcome> {
  return new Promise((resolve, reject) => {
    const { resolve: r0, reject: j0 } = entry;
    entry.resolve = (o) => {
      r0(o);
      resolve(o);
    };
    entry.reject = (e) => {
      j0(e);
      reject(e);
    };
  });
}

/** Two outcomes decide the same thing when they reject alike or append the same events. */
export function sameDecision(a: AnyOutcome, b: AnyOutcome): boolean {
  if (a.accepted !== b.accepted) return false;
  if (!a.accepted || !b.accepted) return !a.accepted && !b.accepted && a.rejection.rejected === b.rejection.rejected && JSON.stringify(a.rejection) === JSON.stringify(b.rejection);
  return JSON.stringify(a.newEvents) === JSON.stringify(b.newEvents);
}

export function delay(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
