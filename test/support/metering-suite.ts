/** A suite of metering tests on a fresh in-memory store each, stopping every Metering a test made (`meterings`) before closing it. */
import { suite } from 'uvu';
import type { Metering } from '../../src/metering/index.ts';
import { openEventStore, type EventStore } from '../../src/store/index.ts';

export interface MeteringContext {
  store: EventStore;
  meterings: Metering[];
}

export function meteringSuite(name: string) {
  const it = suite<MeteringContext>(name);
  it.before.each(async (context) => {
    context.store = await openEventStore({ inMemory: true });
    context.meterings = [];
  });
  it.after.each(async ({ store, meterings }) => {
    for (const m of meterings) await m.stop();
    await store.close();
  });
  return it;
}
