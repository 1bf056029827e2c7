/**
 * The meter's active slots: a process's lease on some of the key's slots (taken and renewed with a
 * reservation, renewed by RenewLease, shrunk at a settlement) and the slots every hold takes.
 */
import { SlotLeaseRenewed, SlotsLeased } from '../events/meter.ts';
import type { Hold, Lease, MeterCommand, MeterState } from './meter-state.ts';

/**
 * How long a lease must still stand for a reservation to renew it alongside its append (the engine
 * call starting at once) rather than take it again and wait: a quarter of its TTL, at most 5 s, which
 * an append exceeds only when the store stalls (and then a decision the store refuses is voided and
 * its early engine call cancelled). A key used every 26 s kept meeting its 60 s lease in the last
 * quarter with the old 15 s, so every other request waited for its append (BENCHMARKS.md, gateway).
 */
export const leaseRenewalMarginMs = (leaseTtlMs: number): number => Math.min(leaseTtlMs / 4, 5_000);

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
export function holdsUnder(state: MeterState, holder: string): number {
  let n = 0;
  for (const hold of state.holds.values()) if (hold.lease === holder) n += 1;
  return n;
}

/** At a settlement: the holder's lease shrinks to the requests it still runs plus those it has waiting, at least one slot. */
export function shrinkLease(state: MeterState, holder: string, waiting: number, now: string) {
  const lease = standingLease(state, holder, Date.parse(now));
  if (!lease) return null;
  const stillRunning = holdsUnder(state, holder) - 1; // the hold being settled is the holder's
  const slots = Math.max(1, stillRunning + waiting);
  return slots < lease.slots ? SlotsLeased({ holder, slots, expires_at: lease.expiresAt, at: now }) : null;
}

/**
 * RenewLease: the holder's lease stands another TTL once less than half of it would be left at the
 * holder's next check; lapsed, it is taken again at the size of what runs under it.
 */
export function renewLease(command: Extract<MeterCommand, { type: 'RenewLease' }>, state: MeterState) {
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
