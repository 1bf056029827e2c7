/**
 * The spend decider: the service's daily GPU spend cap, reached at most once per UTC day (stream
 * `spend-<yyyy-mm-dd>`). The rule is here: a day's spend at or over the cap reaches it; under it, or
 * with no cap, nothing happens. The spend itself is read from the daily_spend projection and passed in.
 */
import type { Decider } from '../src/event-sourcing/index.ts';
import { SpendCapReached, spendEvents, type SpendEvent } from '../events/spend.ts';

export type SpendCommand = { type: 'CheckSpend'; day: string; spend: number; cap: number | null; now: string };

export const spendDecider: Decider<{ reached: boolean }, SpendCommand, SpendEvent> = {
  events: spendEvents,
  initialState: () => ({ reached: false }),
  evolve: () => ({ reached: true }),
  decide(command, state) {
    if (state.reached || command.cap === null || command.spend < command.cap) return [];
    return SpendCapReached({ day: command.day, spend: command.spend, cap: command.cap, at: command.now });
  },
};
