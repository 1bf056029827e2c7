/**
 * Reactions to the passing of time: the hold reaper and the spend watcher. Each is a pure
 * `decide(tick, view)`: the tick brings the time, the view is what a read model says at that time
 * (open holds past their expiry; the day's spend), and the output is commands with ids derived from
 * what they act on. They keep no state of their own: the read models are it, and a tick that died
 * half-way is decided again from them at the next one, its commands appending nothing twice.
 */
import type { WorkflowCommand } from '../src/event-sourcing/index.ts';
import { spendStream, utcDay } from '../events/index.ts';
import type { MeterCommand } from './meter.ts';
import type { SpendCommand } from './spend.ts';

export interface Tick {
  readonly now: string;
}

/** An open hold as the meter_holds projection lists it. */
export interface ExpiringHold {
  readonly requestId: string;
  readonly streamId: string;
  readonly expiresAt: Date;
}

/**
 * The reaper: a hold past its expiry whose request no longer runs here is expired on its own day's
 * stream (the meter decider charges it whole, and expires nothing a renewal moved on meanwhile). A
 * hold of a request still running in this process is left alone: this process renews it.
 */
export function reapHolds(tick: Tick, view: { expired: readonly ExpiringHold[]; runningHere: ReadonlySet<string> }): WorkflowCommand<Extract<MeterCommand, { type: 'Expire' }>>[] {
  return view.expired
    .filter((hold) => !view.runningHere.has(hold.requestId) && hold.expiresAt.getTime() <= Date.parse(tick.now))
    .map((hold) => ({ stream: hold.streamId, commandId: `expire:${hold.requestId}`, command: { type: 'Expire', requestId: hold.requestId, now: tick.now } }));
}

/**
 * The spend watcher: the day's spend so far is reported to the day's spend stream, whose decider
 * reaches the cap when it is met (the threshold is its rule, not this one's). Nothing is sent with no
 * cap, or once the cap is known reached today. The command's id names the spend seen, so a report of
 * the same spend is sent once.
 */
export function watchSpend(tick: Tick, view: { spendMicros: number; capMicros: number | null; reachedDay: string | null }): WorkflowCommand<SpendCommand>[] {
  const day = utcDay(tick.now);
  const { spendMicros, capMicros } = view;
  if (capMicros === null || view.reachedDay === day) return [];
  return [{ stream: spendStream(day), commandId: `spend-check:${day}:${spendMicros}`, command: { type: 'CheckSpend', day, spendMicros, capMicros, now: tick.now } }];
}
