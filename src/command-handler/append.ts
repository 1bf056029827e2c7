/** A batch of decisions in stored form, and its append (sent again while its outcome is unknown). */
import { DuplicateEventId, WrongExpectedVersion, type AppendResult, type EventLog, type ExpectedVersion, type NewEvent } from '../store/index.ts';
import { schemaVersionKey } from '../event-sourcing/index.ts';
import { eventIdFor } from './event-ids.ts';
import { commandIdKey, originKey } from './types.ts';
import { delay, type Entry, type Slot } from './slot.ts';

/**
 * An entry's events in stored form: ids derived from its command id, its caller's metadata and ours.
 * Made when the append is sent, not when decided: a decision's caller (an engine call started in a
 * slot lease) goes on before the append's encoding.
 */
export function toAppend(slot: Slot, entry: Entry, origin: string): NewEvent[] {
  if (!entry.outcome.accepted) return [];
  return entry.outcome.newEvents.map((e, i) => ({
    id: eventIdFor(entry.commandId, i),
    type: e.type,
    data: e.data,
    // Ours win over the caller's; Object.assign, not a spread followed by more keys (several times slower in V8).
    metadata: Object.assign({}, entry.options.metadata, { [commandIdKey]: entry.commandId, [originKey]: origin, [schemaVersionKey]: slot.decider.events.versionOf(e.type) }),
  }));
}

/** An append whose outcome is unknown (connection lost) is sent again with the same ids at the same version, up to `maxResends` times. */
export async function appendWithResends(store: EventLog, streamId: string, events: NewEvent[], expected: ExpectedVersion, maxResends: number): Promise<AppendResult> {
  for (let resend = 0; ; resend++) {
    try {
      return await store.append(streamId, events, expected);
    } catch (error) {
      if (error instanceof WrongExpectedVersion || error instanceof DuplicateEventId || resend >= maxResends) throw error;
      await delay(50 * 4 ** resend);
    }
  }
}
