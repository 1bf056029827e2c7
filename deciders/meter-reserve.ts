/** The meter's reservations: Reserve (rate, active slots, budgets, the lease a request runs under) and Renew. */
import { reject } from '../src/event-sourcing/index.ts';
import { BudgetReserved, ReservationRenewed, SlotLeaseRenewed, SlotsLeased } from '../events/meter.ts';
import { budgetRetryAfterSeconds, outputRoom } from './meter-budgets.ts';
import { activeSlots, holdsUnder, leaseRenewalMarginMs, standingLease } from './meter-slots.ts';
import { budgetNames, minuteMs, type BudgetName, type MeterCommand, type MeterState } from './meter-state.ts';

export function reserve(command: Extract<MeterCommand, { type: 'Reserve' }>, state: MeterState) {
  if (!state.opened) return reject('meter_not_opened', 'the meter day must be opened before a reservation');
  if (state.closed) return reject('meter_closed', `meter day ${state.day} is closed: the next day has opened`);
  if (command.keyStatus !== 'active') return reject('key_inactive', `the key is ${command.keyStatus}`, { status: command.keyStatus });
  // Holds are keyed by request id, and a client may choose its X-Request-Id: a second hold under the same
  // id would replace the first, freeing its tokens and its active slot while both requests run.
  if (state.holds.has(command.facts.request_id)) {
    return reject('duplicate_request', `request ${command.facts.request_id} already holds a reservation`, { request_id: command.facts.request_id });
  }
  const now = Date.parse(command.now);
  const recent = state.starts.since(now - minuteMs);
  if (recent.size >= command.limits.perMinute) {
    // The start that must leave the minute before one more fits (the window is kept in time order).
    const retryAfterSeconds = Math.max(1, Math.ceil((recent.at(recent.size - command.limits.perMinute) + minuteMs - now) / 1000));
    return reject('rate_limited', `more than ${command.limits.perMinute} request starts in the last minute`, { retry_after_seconds: retryAfterSeconds });
  }
  // A slot: in this process's standing lease if it has room; else one more slot for the lease (or for
  // the hold alone) if the key has one free. A lease in its second half is renewed alongside while it
  // still covers the append by a wide margin (leaseRenewalMarginMs); closer to its end it is taken
  // again, as if new, so the reservation waits for it.
  const holder = command.lease?.holder ?? null;
  const leaseTtlMs = command.lease?.ttlMs ?? 0;
  const lease = holder === null ? null : standingLease(state, holder, now);
  const left = lease === null ? 0 : Date.parse(lease.expiresAt) - now;
  const mine = holder === null ? 0 : holdsUnder(state, holder);
  const inLease = lease !== null && mine < lease.slots;
  if (!inLease && activeSlots(state, now) >= command.limits.maxActive) {
    return reject('at_capacity', `${command.limits.maxActive} requests of this key are already running`);
  }
  const until = new Date(now + leaseTtlMs).toISOString();
  const leased =
    holder === null || (inLease && left >= leaseTtlMs / 2)
      ? null
      : inLease && left >= leaseRenewalMarginMs(leaseTtlMs)
        ? SlotLeaseRenewed({ holder, expires_at: until, at: command.now })
        : SlotsLeased({ holder, slots: inLease ? lease!.slots : mine + 1, expires_at: until, at: command.now });
  const room = outputRoom(state, command.budgets, command.inputTokens);
  let binding: BudgetName | null = null;
  for (const name of budgetNames) if (binding === null || room[name] < room[binding]) binding = name;
  const fit = binding === null ? Infinity : Math.floor(room[binding] / command.choices);
  if (fit < 1) {
    return reject('budget_exceeded', `the key's ${binding!.replaceAll('_', ' ')} cannot cover this request`, {
      budget: binding,
      retry_after_seconds: budgetRetryAfterSeconds(state, binding!, now),
    });
  }
  const applied = Math.min(command.maxTokens, fit);
  const reserved = BudgetReserved({
    input_tokens: command.inputTokens,
    output_tokens: applied * command.choices,
    max_tokens_requested: command.maxTokensRequested,
    max_tokens_applied: applied,
    choices: command.choices,
    clamped_by: applied < command.maxTokens ? binding : null,
    at: command.now,
    expires_at: new Date(now + command.ttlMs).toISOString(),
    lease_holder: holder,
    budgets: {
      monthly_token_budget: command.budgets.monthly_token_budget,
      daily_token_budget: command.budgets.daily_token_budget,
      monthly_input_token_budget: command.budgets.monthly_input_token_budget,
      monthly_output_token_budget: command.budgets.monthly_output_token_budget,
    },
    limits: { max_active: command.limits.maxActive, per_minute: command.limits.perMinute, max_queued: command.limits.maxQueued ?? null },
    ...command.facts, // last: see settlementFacts
  });
  return leased ? [leased, reserved] : reserved;
}

/** Renew: only on the hold's own day (where it is settled or expired), and never earlier than it stands. */
export function renew(command: Extract<MeterCommand, { type: 'Renew' }>, state: MeterState) {
  const hold = state.holds.get(command.requestId);
  if (!hold || hold.day !== state.day || Date.parse(command.expiresAt) <= Date.parse(hold.expiresAt)) return [];
  return ReservationRenewed({ request_id: command.requestId, expires_at: command.expiresAt, at: command.now });
}
