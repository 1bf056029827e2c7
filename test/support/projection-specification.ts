/**
 * Projection tests: apply the same events twice, in separate transactions, on a real database, and
 * compare the rows after each pass; a projection that is not idempotent fails here.
 */
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import type { Projection } from '../../src/processors/index.ts';
import type { EventStore, RecordedEvent } from '../../src/store/index.ts';
import { schemaVersionKey, type DomainEvent } from '../../src/event-sourcing/index.ts';

let position = 0;

/** A stored event as the runner hands it over, for a projection fixture. */
export function recorded(event: DomainEvent, at: { streamId: string; streamVersion: number; recordedAt?: Date; metadata?: Record<string, unknown> }): RecordedEvent {
  position++;
  return {
    id: randomUUID(),
    type: event.type,
    data: event.data,
    metadata: { [schemaVersionKey]: 1, ...at.metadata },
    streamId: at.streamId,
    streamVersion: at.streamVersion,
    globalPosition: { transactionId: position, position },
    recordedAt: at.recordedAt ?? new Date(),
  };
}

/** Applies `events` twice and returns the rows `query` reads (identical after both passes). */
export async function applyTwice(store: EventStore, projection: Projection, events: readonly RecordedEvent[], query: string): Promise<Record<string, unknown>[]> {
  await store.transaction((tx) => projection.init(tx));
  const pass = async () => {
    const relevant = projection.eventTypes ? events.filter((e) => projection.eventTypes!.includes(e.type)) : events;
    await store.transaction((tx) => projection.apply(relevant, tx));
    const { rows } = await store.query<Record<string, unknown>>(query);
    return rows.map((r) => JSON.parse(JSON.stringify(r)) as Record<string, unknown>);
  };
  const first = await pass();
  const second = await pass();
  assert.equal(second, first, `${projection.name}: applying the same events again changed the rows`);
  return first;
}
