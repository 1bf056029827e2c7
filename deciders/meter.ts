/**
 * The meter decider: one key's budgets, rate and active requests for one UTC day (stream
 * `meter-<keyId>-<yyyy-mm-dd>`). Reserve before the engine runs, settle with the engine's real usage,
 * expire holds whose request died. Pure: time, budgets, limits and the key's status come in on the
 * command. Its state and commands are in meter-state.ts; each group of commands decides in a module
 * of its own: the day (meter-day.ts), reservations (meter-reserve.ts), a hold's end (meter-settle.ts),
 * slot leases (meter-slots.ts), the queue (meter-queue.ts), the budgets they share (meter-budgets.ts).
 */
import type { Decider } from '../src/event-sourcing/index.ts';
import { meterEvents, type MeterEvent } from '../events/meter.ts';
import { utcDay } from '../events/shapes.ts';
import { charge, sameMonth } from './meter-budgets.ts';
import { closeMeter, openMeter } from './meter-day.ts';
import { leaveQueue, queue, renewQueued, withoutEntry } from './meter-queue.ts';
import { renew, reserve } from './meter-reserve.ts';
import { expire, recordRejection, releaseCarried, settle } from './meter-settle.ts';
import { renewLease } from './meter-slots.ts';
import { minuteMs, type Hold, type Lease, type MeterCommand, type MeterRejection, type MeterState } from './meter-state.ts';
import { StartWindow } from './start-window.ts';

export type { BudgetName, Hold, Lease, MeterCommand, MeterRejection, MeterState, QueueEntry } from './meter-state.ts';
export { budgetRetryAfterSeconds, heldTokens, outputRoom } from './meter-budgets.ts';
export { balanceFrom, meterDayAfterRefusal } from './meter-day.ts';
export { queuedRequests } from './meter-queue.ts';
export { activeSlots, leaseLapsed, standingLease } from './meter-slots.ts';
export { secondsUntilUtcTurn } from '../events/shapes.ts';

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
        return openMeter(command, state);
      case 'CloseMeter':
        return closeMeter(command, state);
      case 'Reserve':
        return reserve(command, state);
      case 'Renew':
        return renew(command, state);
      case 'Settle':
        return settle(command, state);
      case 'RenewLease':
        return renewLease(command, state);
      case 'Expire':
        return expire(command, state);
      case 'ReleaseCarried':
        return releaseCarried(command, state);
      case 'Queue':
        return queue(command, state);
      case 'RenewQueued':
        return renewQueued(command, state);
      case 'LeaveQueue':
        return leaveQueue(command, state);
      case 'RecordRejection':
        return recordRejection(command);
      default: {
        const unhandled: never = command;
        throw new Error(`unknown meter command ${JSON.stringify(unhandled)}`);
      }
    }
  },
};
