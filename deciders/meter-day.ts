/** The meter's day: OpenMeter with the balance carried from the previous day, CloseMeter, and where a refused command goes instead. */
import { MeterClosed, MeterOpened, type MeterOpening } from '../events/meter.ts';
import { dayAfter, monthOfDay } from '../events/shapes.ts';
import { standingLease } from './meter-slots.ts';
import { minuteMs, type MeterCommand, type MeterRejection, type MeterState } from './meter-state.ts';

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

export function openMeter(command: Extract<MeterCommand, { type: 'OpenMeter' }>, state: MeterState) {
  return state.opened ? [] : MeterOpened({ ...command.opening, carried_queue: command.opening.carried_queue ?? [], at: command.now });
}

export function closeMeter(command: Extract<MeterCommand, { type: 'CloseMeter' }>, state: MeterState) {
  return state.closed || !state.opened ? [] : MeterClosed({ day: state.day!, next_day: command.nextDay, at: command.now });
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
