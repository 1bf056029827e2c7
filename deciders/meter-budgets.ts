/** The meter's budgets: tokens charged and held against the month and the day, the room left, when a refusal may retry. */
import type { KeyBudgetValues } from '../events/key.ts';
import { monthOfDay, secondsUntilUtcTurn } from '../events/shapes.ts';
import type { BudgetName, MeterState } from './meter-state.ts';

/** Whether a meter day falls in the month of the stream's day. */
export const sameMonth = (holdDay: string, day: string | null): boolean => day !== null && monthOfDay(holdDay) === monthOfDay(day);

/** Releases a hold and charges what was used against this stream's month and/or day. */
export function charge(state: MeterState, requestId: string, input: number, output: number, { month, today }: { month: boolean; today: boolean }): MeterState {
  const holds = new Map(state.holds);
  holds.delete(requestId);
  return {
    ...state,
    holds,
    monthInput: state.monthInput + (month ? input : 0),
    monthOutput: state.monthOutput + (month ? output : 0),
    todayInput: state.todayInput + (today ? input : 0),
    todayOutput: state.todayOutput + (today ? output : 0),
  };
}

/**
 * Tokens held by open reservations against this month (a hold carried from the previous month's last
 * day is that month's: it is charged on its own stream) and those made on this stream's day.
 */
export function heldTokens(state: MeterState): { input: number; output: number; todayInput: number; todayOutput: number } {
  const held = { input: 0, output: 0, todayInput: 0, todayOutput: 0 };
  for (const hold of state.holds.values()) {
    if (sameMonth(hold.day, state.day)) {
      held.input += hold.input;
      held.output += hold.output;
    }
    if (hold.day === state.day) {
      held.todayInput += hold.input;
      held.todayOutput += hold.output;
    }
  }
  return held;
}

/**
 * Room left for output tokens under each budget that is set, once the prompt is counted:
 * Infinity when a budget is unset, negative when even the prompt does not fit.
 */
export function outputRoom(state: MeterState, budgets: KeyBudgetValues, inputTokens: number): Record<BudgetName, number> {
  const held = heldAgainst(state);
  const room = (budget: number | null, used: number, extraInput: number) => (budget === null ? Infinity : budget - used - extraInput);
  const input = budgets.monthly_input_token_budget;
  return {
    monthly_token_budget: room(budgets.monthly_token_budget, state.monthInput + state.monthOutput + held.monthly_token_budget, inputTokens),
    daily_token_budget: room(budgets.daily_token_budget, state.todayInput + state.todayOutput + held.daily_token_budget, inputTokens),
    // The input budget cannot be met by lowering max_tokens: it either fits whole or not at all.
    monthly_input_token_budget: input === null || state.monthInput + held.monthly_input_token_budget + inputTokens <= input ? Infinity : -1,
    monthly_output_token_budget: room(budgets.monthly_output_token_budget, state.monthOutput + held.monthly_output_token_budget, 0),
  };
}

/** Tokens open holds count against each budget. */
function heldAgainst(state: MeterState): Record<BudgetName, number> {
  const held = heldTokens(state);
  return {
    monthly_token_budget: held.input + held.output,
    daily_token_budget: held.todayInput + held.todayOutput,
    monthly_input_token_budget: held.input,
    monthly_output_token_budget: held.output,
  };
}

/**
 * When a request refused by `budget` can next fit: as soon as an open hold on that budget settles (a
 * settlement charges what was used, often less than the hold), so 1 s while any is open; otherwise not
 * before the budget's period turns: the next UTC day for the daily budget, the 1st of the next UTC month
 * for the monthly ones (or when an operator raises the budget, which no clock can tell).
 */
export function budgetRetryAfterSeconds(state: MeterState, budget: BudgetName, now: number): number {
  if (heldAgainst(state)[budget] > 0) return 1;
  return secondsUntilUtcTurn(now, budget === 'daily_token_budget' ? 'day' : 'month');
}
