/**
 * The meter decider: one key's budgets, rate and active requests for one UTC day (stream
 * `meter-<keyId>-<yyyy-mm-dd>`). Reserve before the engine runs, settle with the engine's real usage,
 * expire holds whose request died. Pure: time, budgets, limits and the key's status come in on the
 * command.
 */
import { reject, type Decider, type Rejection } from '../src/event-sourcing/index.ts';
import type { KeyBudgetValues } from '../events/key.ts';
import {
  BudgetReserved,
  CarriedHoldEnded,
  CarriedHoldReleased,
  MeterClosed,
  MeterOpened,
  meterEvents,
  QueueEntriesRenewed,
  QueueLeft,
  RequestQueued,
  RequestRejected,
  LateUsageRecorded,
  ReservationExpired,
  ReservationRenewed,
  SlotLeaseRenewed,
  SlotsLeased,
  UsageSettled,
  type BillingBasisName,
  type MeterEvent,
  type MeterOpening,
  type RequestFactsData,
} from '../events/meter.ts';
import { dayAfter, monthOfDay, secondsUntilUtcTurn, utcDay } from '../events/shapes.ts';
import type { KeyStatus } from './key.ts';
import { StartWindow } from './start-window.ts';

export interface Hold {
  readonly input: number;
  readonly output: number;
  /** The meter day whose stream holds the reservation (another day's when carried over midnight). */
  readonly day: string;
  readonly at: string;
  readonly expiresAt: string;
  /** The process whose slot lease the request runs under; null: it takes a slot of its own. */
  readonly lease: string | null;
}

/** A request waiting for an active slot on a process (events/meter.ts, RequestQueued). */
export interface QueueEntry {
  readonly holder: string;
  readonly at: string;
  readonly expiresAt: string;
}

/** A process's lease on some of the key's active slots (events/meter.ts, SlotsLeased). */
export interface Lease {
  readonly slots: number;
  readonly expiresAt: string;
}

export interface MeterState {
  readonly opened: boolean;
  /** The next day opened from this one: reservations go there. */
  readonly closed: boolean;
  readonly day: string | null;
  /** Charged this month, today included (settlements and expiries). */
  readonly monthInput: number;
  readonly monthOutput: number;
  /** Charged on this stream's day. */
  readonly todayInput: number;
  readonly todayOutput: number;
  /**
   * Open reservations by request id: requests running now. A Map, not a record: every request adds and
   * removes a key of its own, and an object would take a new hidden class each time (BENCHMARKS.md, gateway).
   */
  readonly holds: ReadonlyMap<string, Hold>;
  /** Request starts (epoch ms) of the last minute, oldest first. */
  readonly starts: StartWindow;
  /** Slot leases by holder (a gateway process); one that lapsed counts for nothing. */
  readonly leases: Readonly<Record<string, Lease>>;
  /** Requests waiting for a slot, by request id; one whose process stopped renewing it (lapsed) counts for nothing. */
  readonly queue: Readonly<Record<string, QueueEntry>>;
  /**
   * Request ids whose hold expired on this stream and whose settlement has not come: one that comes
   * late is recorded (LateUsageRecorded), once. Expiries are rare (a dead or starved process), so this stays small.
   */
  readonly expired: readonly string[];
}

export type BudgetName = 'monthly_token_budget' | 'daily_token_budget' | 'monthly_input_token_budget' | 'monthly_output_token_budget';

export type MeterCommand =
  | { type: 'OpenMeter'; opening: MeterOpening; now: string }
  | {
      type: 'Reserve';
      facts: RequestFactsData;
      inputTokens: number;
      /** max_tokens as the request stands (requested, or the injected default, after any deadline clamp). */
      maxTokens: number;
      /** What the client asked for (null: omitted). */
      maxTokensRequested: number | null;
      choices: number;
      budgets: KeyBudgetValues;
      keyStatus: KeyStatus;
      /** maxQueued, when given, is recorded with the reservation (the queue bound is applied by Queue). */
      limits: { maxActive: number; perMinute: number; maxQueued?: number };
      ttlMs: number;
      /** Reserve within this process's slot lease, taking or growing it when it has no room (absent: a slot of its own). */
      lease?: { holder: string; ttlMs: number };
      now: string;
    }
  | { type: 'Renew'; requestId: string; expiresAt: string; now: string }
  /**
   * The holder still runs requests under its slot lease: the lease stands another TTL once less than
   * half of it would be left at the holder's next check (`nextCheckMs` from now); lapsed, it is taken
   * again at the size of what runs under it. Nothing runs under it: nothing (it lapses, or shrinks).
   */
  | { type: 'RenewLease'; holder: string; ttlMs: number; nextCheckMs: number; now: string }
  | {
      type: 'Settle';
      facts: RequestFactsData;
      inputTokens: number;
      outputTokens: number;
      status: number;
      latencyMs: number;
      gpuSeconds: number;
      /** The charge in micro-units (deciders/billing.ts, chargeMicros) and the price per GPU-second it applied (null: nothing was priced). */
      costMicros: number;
      pricePerGpuSecondMicros: number | null;
      /** What the token counts rest on (deciders/billing.ts). */
      basis: BillingBasisName;
      disconnected: boolean;
      /** A stream cut short: output tokens generated (billed) and content frames the client's socket took (absent or null: not a cut-short stream). */
      generatedOutputTokens?: number | null;
      relayedOutputTokens?: number | null;
      /** The settling process, and how many more of the key's requests it has waiting: its lease shrinks to what it still needs. */
      lease?: { holder: string; waiting: number };
      now: string;
    }
  | { type: 'CloseMeter'; nextDay: string; now: string }
  | { type: 'Expire'; requestId: string; now: string }
  | { type: 'ReleaseCarried'; requestId: string; day: string; inputTokens: number; outputTokens: number; now: string }
  | {
      type: 'RecordRejection';
      facts: RequestFactsData;
      code: string;
      status: number;
      inputTokens: number;
      latencyMs: number;
      /** The budget or limit that refused (null: another refusal), and the Retry-After given (null: none). */
      refusedBy: string | null;
      retryAfterSeconds: number | null;
      now: string;
    }
  /** A request refused `at_capacity` waits for a slot, in the holder's queue, if the key's queue has room. */
  | { type: 'Queue'; requestId: string; holder: string; maxQueued: number; ttlMs: number; now: string }
  /** The holder's requests still waiting: their entries stand another TTL. */
  | { type: 'RenewQueued'; holder: string; requestIds: readonly string[]; ttlMs: number; now: string }
  /** A waiting request gave up without a reservation. */
  | { type: 'LeaveQueue'; requestId: string; now: string };

export type MeterRejection = Rejection<'meter_not_opened' | 'meter_closed' | 'key_inactive' | 'duplicate_request' | 'rate_limited' | 'at_capacity' | 'budget_exceeded' | 'queue_full'>;

/**
 * Where a command refused for its meter day goes instead: a closed day's work goes on on the next day
 * (the day that closed it carried its holds and its queue); a day not opened yet is carried by the
 * previous one. Null: the refusal is final. Metering and its queue both follow it.
 */
export function meterDayAfterRefusal(rejection: MeterRejection, day: string): string | null {
  if (rejection.rejected === 'meter_closed') return dayAfter(day, 1);
  if (rejection.rejected === 'meter_not_opened') return dayAfter(day, -1);
  return null;
}

const minuteMs = 60_000;
const budgetNames: readonly BudgetName[] = ['monthly_token_budget', 'daily_token_budget', 'monthly_input_token_budget', 'monthly_output_token_budget'];

export const meterDecider: Decider<MeterState, MeterCommand, MeterEvent, MeterRejection> = {
  events: meterEvents,
  initialState: () => ({ opened: false, closed: false, day: null, monthInput: 0, monthOutput: 0, todayInput: 0, todayOutput: 0, holds: new Map(), starts: StartWindow.empty, leases: {}, queue: {}, expired: [] }),
  evolve(state, event) {
    switch (event.type) {
      case 'MeterOpened': {
        const d = event.data;
        const holds = new Map<string, Hold>();
        for (const h of d.carried_holds) {
          holds.set(h.request_id, { input: h.input_tokens, output: h.output_tokens, day: h.day, at: h.at, expiresAt: h.expires_at, lease: h.lease_holder });
        }
        const leases: Record<string, Lease> = {};
        for (const l of d.carried_leases) leases[l.holder] = { slots: l.slots, expiresAt: l.expires_at };
        return {
          opened: true,
          closed: false,
          day: d.day,
          monthInput: d.month_input_tokens,
          monthOutput: d.month_output_tokens,
          todayInput: 0,
          todayOutput: 0,
          holds,
          starts: StartWindow.of(d.recent_starts),
          leases,
          queue: Object.fromEntries(d.carried_queue.map((q) => [q.request_id, { holder: q.holder, at: q.at, expiresAt: q.expires_at }])),
          expired: [],
        };
      }
      case 'BudgetReserved': {
        const d = event.data;
        const at = Date.parse(d.at);
        const hold: Hold = { input: d.input_tokens, output: d.output_tokens, day: state.day ?? utcDay(d.at), at: d.at, expiresAt: d.expires_at, lease: d.lease_holder };
        // A waiting request's reservation takes it out of the queue.
        const queue = state.queue[d.request_id] ? withoutEntry(state.queue, d.request_id) : state.queue;
        // A request id reused after its hold expired: a settlement under it now settles the new hold.
        const expired = state.expired.includes(d.request_id) ? state.expired.filter((id) => id !== d.request_id) : state.expired;
        return { ...state, holds: new Map(state.holds).set(d.request_id, hold), starts: state.starts.since(at - minuteMs).with(at), queue, expired };
      }
      case 'SlotsLeased':
        return { ...state, leases: { ...state.leases, [event.data.holder]: { slots: event.data.slots, expiresAt: event.data.expires_at } } };
      case 'SlotLeaseRenewed': {
        const lease = state.leases[event.data.holder];
        return lease ? { ...state, leases: { ...state.leases, [event.data.holder]: { ...lease, expiresAt: event.data.expires_at } } } : state;
      }
      case 'ReservationRenewed': {
        const hold = state.holds.get(event.data.request_id);
        return hold ? { ...state, holds: new Map(state.holds).set(event.data.request_id, { ...hold, expiresAt: event.data.expires_at }) } : state;
      }
      case 'UsageSettled':
        return charge(state, event.data.request_id, event.data.input_tokens, event.data.output_tokens, { month: true, today: true });
      case 'ReservationExpired': {
        const charged = charge(state, event.data.request_id, event.data.input_tokens, event.data.output_tokens, { month: true, today: true });
        return { ...charged, expired: [...state.expired, event.data.request_id] };
      }
      case 'LateUsageRecorded':
        // Charges nothing: the expiry charged the whole hold.
        return { ...state, expired: state.expired.filter((id) => id !== event.data.request_id) };
      case 'CarriedHoldReleased':
        // Charged on its own day's stream already; it counts in this month only if that day is in it.
        return charge(state, event.data.request_id, event.data.input_tokens, event.data.output_tokens, { month: sameMonth(event.data.day, state.day), today: false });
      case 'MeterClosed':
        return { ...state, closed: true };
      case 'CarriedHoldEnded':
      case 'RequestRejected':
        return state;
      case 'RequestQueued': {
        const d = event.data;
        // Entries that lapsed by now are dropped here, so a day's state does not grow with dead processes' entries.
        const at = Date.parse(d.at);
        const queue = Object.fromEntries(Object.entries(state.queue).filter(([, q]) => Date.parse(q.expiresAt) > at));
        return { ...state, queue: { ...queue, [d.request_id]: { holder: d.holder, at: d.at, expiresAt: d.expires_at } } };
      }
      case 'QueueEntriesRenewed': {
        const queue = { ...state.queue };
        for (const id of event.data.request_ids) if (queue[id]) queue[id] = { ...queue[id], expiresAt: event.data.expires_at };
        return { ...state, queue };
      }
      case 'QueueLeft':
        return { ...state, queue: withoutEntry(state.queue, event.data.request_id) };
    }
  },
  decide(command, state) {
    switch (command.type) {
      case 'OpenMeter':
        return state.opened ? [] : MeterOpened({ ...command.opening, carried_queue: command.opening.carried_queue ?? [], at: command.now });
      case 'CloseMeter':
        return state.closed || !state.opened ? [] : MeterClosed({ day: state.day!, next_day: command.nextDay, at: command.now });
      case 'Reserve':
        return reserve(command, state);
      case 'Renew': {
        const hold = state.holds.get(command.requestId);
        // Only on the hold's own day (where it is settled or expired), and never earlier than it stands.
        if (!hold || hold.day !== state.day || Date.parse(command.expiresAt) <= Date.parse(hold.expiresAt)) return [];
        return ReservationRenewed({ request_id: command.requestId, expires_at: command.expiresAt, at: command.now });
      }
      case 'Settle': {
        const hold = state.holds.get(command.facts.request_id);
        if (!hold || hold.day !== state.day) {
          // A request that outlived its hold: its real usage is recorded next to what the expiry charged, once.
          if (!hold && state.expired.includes(command.facts.request_id)) return LateUsageRecorded(settlementFacts(command));
          // Settled already (a resend), or a hold carried from another day (settled there): nothing to charge here.
          return [];
        }
        const settled = UsageSettled(usageSettledFacts(command));
        const shrunk = command.lease && hold.lease === command.lease.holder ? shrinkLease(state, command.lease.holder, command.lease.waiting, command.now) : null;
        const ended = endedAfterClose(state, command.facts.request_id, command.inputTokens, command.outputTokens, command.now);
        return shrunk || ended ? [settled, ...(shrunk ? [shrunk] : []), ...(ended ? [ended] : [])] : settled;
      }
      case 'RenewLease': {
        if (!state.opened || state.closed) return [];
        const now = Date.parse(command.now);
        const mine = holdsUnder(state, command.holder);
        if (mine === 0) return [];
        const lease = standingLease(state, command.holder, now);
        const until = new Date(now + command.ttlMs).toISOString();
        if (lease) return Date.parse(lease.expiresAt) - now - command.nextCheckMs >= command.ttlMs / 2 ? [] : SlotLeaseRenewed({ holder: command.holder, expires_at: until, at: command.now });
        // Lapsed: its holds take a slot each already, so taking it again at their number takes nothing more.
        return SlotsLeased({ holder: command.holder, slots: mine, expires_at: until, at: command.now });
      }
      case 'Expire': {
        const hold = state.holds.get(command.requestId);
        if (!hold || hold.day !== state.day) return [];
        const now = Date.parse(command.now);
        if (Date.parse(hold.expiresAt) > now && !leaseLapsed(state, hold, now)) return [];
        const expired = ReservationExpired({ request_id: command.requestId, input_tokens: hold.input, output_tokens: hold.output, at: command.now });
        const ended = endedAfterClose(state, command.requestId, hold.input, hold.output, command.now);
        return ended ? [expired, ended] : expired;
      }
      case 'ReleaseCarried': {
        const hold = state.holds.get(command.requestId);
        if (!hold || hold.day !== command.day || hold.day === state.day) return [];
        return CarriedHoldReleased({ request_id: command.requestId, day: command.day, input_tokens: command.inputTokens, output_tokens: command.outputTokens, at: command.now });
      }
      case 'Queue':
        return queue(command, state);
      case 'RenewQueued': {
        if (!state.opened) return reject('meter_not_opened', 'the meter day must be opened before a request queues');
        if (state.closed) return reject('meter_closed', `meter day ${state.day} is closed: its queue was carried into the next day`);
        const now = Date.parse(command.now);
        const expiresAt = new Date(now + command.ttlMs).toISOString();
        // Only entries that still stand: a lapsed one gave its room away and must queue again.
        const standing = command.requestIds.filter((id) => {
          const entry = state.queue[id];
          return entry && entry.holder === command.holder && Date.parse(entry.expiresAt) > now && Date.parse(entry.expiresAt) < now + command.ttlMs;
        });
        return standing.length === 0 ? [] : QueueEntriesRenewed({ holder: command.holder, request_ids: standing, expires_at: expiresAt, at: command.now });
      }
      case 'LeaveQueue':
        if (!state.opened) return reject('meter_not_opened', 'the meter day must be opened before a request leaves its queue');
        if (state.closed) return reject('meter_closed', `meter day ${state.day} is closed: its queue was carried into the next day`);
        return state.queue[command.requestId] ? QueueLeft({ request_id: command.requestId, at: command.now }) : [];
      case 'RecordRejection':
        return RequestRejected({
          code: command.code,
          status: command.status,
          input_tokens: command.inputTokens,
          latency_ms: command.latencyMs,
          at: command.now,
          refused_by: command.refusedBy,
          retry_after_seconds: command.retryAfterSeconds,
          ...command.facts,
        });
      default: {
        const unhandled: never = command;
        throw new Error(`unknown meter command ${JSON.stringify(unhandled)}`);
      }
    }
  },
};

/** What a settlement records: the engine's usage, the GPU time, its price and exact charge, the basis. */
function settlementFacts(command: Extract<MeterCommand, { type: 'Settle' }>) {
  // The facts spread last: V8 builds `{ ...a, x, y }` property by property, several times slower.
  return {
    input_tokens: command.inputTokens,
    output_tokens: command.outputTokens,
    status: command.status,
    latency_ms: command.latencyMs,
    gpu_seconds: command.gpuSeconds,
    disconnected: command.disconnected,
    at: command.now,
    cost_micros: command.costMicros,
    price_per_gpu_second_micros: command.pricePerGpuSecondMicros,
    basis: command.basis,
    ...command.facts,
  };
}

/** A settlement of an open hold: settlementFacts and, for a stream cut short, what was generated and what the client took. */
function usageSettledFacts(command: Extract<MeterCommand, { type: 'Settle' }>) {
  // Two properties added to the literal settlementFacts built: cheap, unlike a spread of it into another.
  const facts = settlementFacts(command) as ReturnType<typeof settlementFacts> & { generated_output_tokens: number | null; relayed_output_tokens: number | null };
  facts.generated_output_tokens = command.generatedOutputTokens ?? null;
  facts.relayed_output_tokens = command.relayedOutputTokens ?? null;
  return facts;
}

/**
 * The balance day `day` opens with, taken from the key's previous meter day `earlier` (closed, so
 * nothing lands there unseen) at `now` (epoch ms). Within one month its tokens are carried; across a
 * month's turn they start again from zero. Either way what still runs or waits is carried, since it
 * takes active slots, queue room and rate: open holds (each keeping its own day, where it is settled),
 * slot leases and queue entries still standing, and the request starts of the last minute.
 */
export function balanceFrom(keyId: string, day: string, earlier: string, state: MeterState, now: number): MeterOpening {
  const sameMonth = monthOfDay(earlier) === monthOfDay(day);
  return {
    key_id: keyId,
    day,
    month_input_tokens: sameMonth ? state.monthInput : 0,
    month_output_tokens: sameMonth ? state.monthOutput : 0,
    carried_from: earlier,
    carried_holds: [...state.holds].map(([request_id, h]) => ({
      request_id,
      day: h.day,
      input_tokens: h.input,
      output_tokens: h.output,
      at: h.at,
      expires_at: h.expiresAt,
      lease_holder: h.lease,
    })),
    carried_leases: Object.keys(state.leases).flatMap((holder) => {
      const lease = standingLease(state, holder, now);
      return lease ? [{ holder, slots: lease.slots, expires_at: lease.expiresAt }] : [];
    }),
    recent_starts: state.starts.since(now - minuteMs).toArray(),
    carried_queue: Object.entries(state.queue).flatMap(([request_id, q]) =>
      Date.parse(q.expiresAt) > now ? [{ request_id, holder: q.holder, at: q.at, expires_at: q.expiresAt }] : [],
    ),
  };
}

/**
 * How long a lease must still stand for a reservation to renew it alongside its append (the engine
 * call starting at once) rather than take it again and wait: a quarter of its TTL, at most 5 s, which
 * an append exceeds only when the store stalls (and then a decision the store refuses is voided and
 * its early engine call cancelled). A key used every 26 s kept meeting its 60 s lease in the last
 * quarter with the old 15 s, so every other request waited for its append (BENCHMARKS.md, gateway).
 */
const leaseRenewalMarginMs = (leaseTtlMs: number): number => Math.min(leaseTtlMs / 4, 5_000);

/** The holder's lease, if it stands at `now` (a lapsed lease counts for nothing). */
export function standingLease(state: MeterState, holder: string, now: number): Lease | null {
  const lease = state.leases[holder];
  return lease && lease.slots > 0 && Date.parse(lease.expiresAt) > now ? lease : null;
}

/**
 * The key's active slots taken at `now`: each standing lease counts its size (or the holds running
 * under it, if more), and every other hold one slot (a hold whose lease lapsed included).
 */
export function activeSlots(state: MeterState, now: number): number {
  const standing = new Map<string, number>();
  for (const holder of Object.keys(state.leases)) {
    const lease = standingLease(state, holder, now);
    if (lease) standing.set(holder, lease.slots);
  }
  const under = new Map<string, number>();
  let taken = 0;
  for (const hold of state.holds.values()) {
    if (hold.lease !== null && standing.has(hold.lease)) under.set(hold.lease, (under.get(hold.lease) ?? 0) + 1);
    else taken += 1;
  }
  for (const [holder, slots] of standing) taken += Math.max(slots, under.get(holder) ?? 0);
  return taken;
}

/**
 * Whether the slot lease a hold was made under has lapsed: its process stopped renewing it (it died,
 * or stalled for more than half a lease), so nobody will settle the hold. Judged only on the day the
 * lease is kept on, an open one: once the day closed, the lease is renewed on the next day's stream
 * and the hold waits for its own expiry.
 */
export function leaseLapsed(state: MeterState, hold: Hold, now: number): boolean {
  return hold.lease !== null && !state.closed && hold.day === state.day && standingLease(state, hold.lease, now) === null;
}

/** Holds running under the holder's lease (standing or not). */
function holdsUnder(state: MeterState, holder: string): number {
  let n = 0;
  for (const hold of state.holds.values()) if (hold.lease === holder) n += 1;
  return n;
}

/** At a settlement: the holder's lease shrinks to the requests it still runs plus those it has waiting, at least one slot. */
function shrinkLease(state: MeterState, holder: string, waiting: number, now: string) {
  const lease = standingLease(state, holder, Date.parse(now));
  if (!lease) return null;
  const stillRunning = holdsUnder(state, holder) - 1; // the hold being settled is the holder's
  const slots = Math.max(1, stillRunning + waiting);
  return slots < lease.slots ? SlotsLeased({ holder, slots, expires_at: lease.expiresAt, at: now }) : null;
}

/**
 * A hold that ends on a closed day was open when the day closed, so the next day carried it: say so,
 * for the carried-holds workflow to release it there (and on any day carried on from there).
 */
function endedAfterClose(state: MeterState, requestId: string, input: number, output: number, now: string) {
  return state.closed ? CarriedHoldEnded({ request_id: requestId, day: state.day!, input_tokens: input, output_tokens: output, at: now }) : null;
}

/** Whether a meter day falls in the month of the stream's day. */
const sameMonth = (holdDay: string, day: string | null): boolean => day !== null && monthOfDay(holdDay) === monthOfDay(day);

/** Releases a hold and charges what was used against this stream's month and/or day. */
function charge(state: MeterState, requestId: string, input: number, output: number, { month, today }: { month: boolean; today: boolean }): MeterState {
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

export { secondsUntilUtcTurn };

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

function withoutEntry(queue: MeterState['queue'], requestId: string): MeterState['queue'] {
  const { [requestId]: _left, ...rest } = queue;
  return rest;
}

/** Requests waiting for a slot at `now` (epoch ms), across every process: entries that lapsed count for nothing. */
export function queuedRequests(state: MeterState, now: number): number {
  let queued = 0;
  for (const entry of Object.values(state.queue)) if (Date.parse(entry.expiresAt) > now) queued += 1;
  return queued;
}

function queue(command: Extract<MeterCommand, { type: 'Queue' }>, state: MeterState) {
  if (!state.opened) return reject('meter_not_opened', 'the meter day must be opened before a request queues');
  if (state.closed) return reject('meter_closed', `meter day ${state.day} is closed: the next day has opened`);
  const now = Date.parse(command.now);
  const entry = state.queue[command.requestId];
  // Already waiting here (queued again after its reservation was decided again and refused): nothing to add.
  if (entry && entry.holder === command.holder && Date.parse(entry.expiresAt) > now) return [];
  if (state.holds.has(command.requestId) || (entry && Date.parse(entry.expiresAt) > now)) {
    return reject('duplicate_request', `request ${command.requestId} already holds a reservation or waits for one`, { request_id: command.requestId });
  }
  const queued = queuedRequests(state, now);
  if (queued >= command.maxQueued) {
    return reject('queue_full', `the key already has ${command.maxQueued} requests waiting for an active slot`, { queued });
  }
  return RequestQueued({ request_id: command.requestId, holder: command.holder, at: command.now, expires_at: new Date(now + command.ttlMs).toISOString() });
}

function reserve(command: Extract<MeterCommand, { type: 'Reserve' }>, state: MeterState) {
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
