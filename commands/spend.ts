/** The spend decider: the daily cap is reached once per UTC day (stream `spend-<yyyy-mm-dd>`). */
import type { Decider } from '../src/event-sourcing/index.ts';
import { SpendCapReached, spendEvents, type SpendEvent } from '../events/spend.ts';

export type SpendCommand = { type: 'ReachSpendCap'; day: string; spend: number; cap: number; now: string };

export const spendDecider: Decider<{ reached: boolean }, SpendCommand, SpendEvent> = {
  events: spendEvents,
  initialState: () => ({ reached: false }),
  evolve: () => ({ reached: true }),
  decide: (command, state) => (state.reached ? [] : SpendCapReached({ day: command.day, spend: command.spend, cap: command.cap, at: command.now })),
};
