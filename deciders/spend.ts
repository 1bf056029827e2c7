/**
 * The spend decider: the service's daily GPU spend cap, reached at most once per UTC day (stream
 * `spend-<yyyy-mm-dd>`). The rule is here: a day's spend at or over the cap reaches it; under it, or
 * with no cap, nothing happens. The spend itself is read from the daily_spend projection and passed in.
 * Both are integer micro-units of the configured currency unit, so the comparison is exact.
 */
import type { Decider } from '../src/event-sourcing/index.ts';
import { SpendCapReached, spendEvents, type SpendEvent } from '../events/spend.ts';
import { utcDay } from '../events/shapes.ts';

/** The day's spend and the cap in integer micro-units (daily_spend.cost_micros; SVC_DAILY_SPEND_CAP × 1e6, rounded). */
export type SpendCommand = { type: 'CheckSpend'; day: string; spendMicros: number; capMicros: number | null; now: string };

/**
 * Does the cap pause the service at `now`? Only on the UTC day it was reached (`cappedDay`, from that
 * day's SpendCapReached): each day has its own stream and starts unpaused. Metering asks this on every
 * admission.
 */
export function spendCapPauses(cappedDay: string | null, now: Date): boolean {
  return cappedDay !== null && cappedDay === utcDay(now);
}

export const spendDecider: Decider<{ reached: boolean }, SpendCommand, SpendEvent> = {
  events: spendEvents,
  initialState: () => ({ reached: false }),
  evolve: () => ({ reached: true }),
  decide(command, state) {
    const { spendMicros: spend, capMicros: cap } = command;
    if (state.reached || cap === null || spend < cap) return [];
    if (!Number.isSafeInteger(spend) || !Number.isSafeInteger(cap)) throw new RangeError('CheckSpend takes the spend and the cap in integer micro-units');
    return SpendCapReached({ day: command.day, at: command.now, spend_micros: spend, cap_micros: cap });
  },
};
