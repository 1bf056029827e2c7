/** The meter's queue: a request refused `at_capacity` waits for a slot in its process's queue, renewed while it waits. */
import { reject } from '../src/event-sourcing/index.ts';
import { QueueEntriesRenewed, QueueLeft, RequestQueued } from '../events/meter.ts';
import type { MeterCommand, MeterState } from './meter-state.ts';

export function withoutEntry(queue: MeterState['queue'], requestId: string): MeterState['queue'] {
  const { [requestId]: _left, ...rest } = queue;
  return rest;
}

/** Requests waiting for a slot at `now` (epoch ms), across every process: entries that lapsed count for nothing. */
export function queuedRequests(state: MeterState, now: number): number {
  let queued = 0;
  for (const entry of Object.values(state.queue)) if (Date.parse(entry.expiresAt) > now) queued += 1;
  return queued;
}

export function queue(command: Extract<MeterCommand, { type: 'Queue' }>, state: MeterState) {
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

export function renewQueued(command: Extract<MeterCommand, { type: 'RenewQueued' }>, state: MeterState) {
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

export function leaveQueue(command: Extract<MeterCommand, { type: 'LeaveQueue' }>, state: MeterState) {
  if (!state.opened) return reject('meter_not_opened', 'the meter day must be opened before a request leaves its queue');
  if (state.closed) return reject('meter_closed', `meter day ${state.day} is closed: its queue was carried into the next day`);
  return state.queue[command.requestId] ? QueueLeft({ request_id: command.requestId, at: command.now }) : [];
}
