/** Command handler: read, decide, append with the expected version, retry on conflict, serialize per stream. */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import { CommandHandler, type Decider } from '../../src/command-handler/index.ts';
import { openEventStore, WrongExpectedVersion, type EventStore } from '../../src/store/index.ts';

// A toy ticket counter with a cap: enough rules to see decisions made on stale and fresh state.
type TicketEvent =
  | { type: 'TicketIssued'; data: { number: number; at: string }; id?: string }
  | { type: 'CounterClosed'; data: { at: string }; id?: string };
type TicketCommand = { type: 'IssueTicket'; metadata: { now: string; id?: string } } | { type: 'Close'; metadata: { now: string } } | { type: 'Noop' };
interface TicketState {
  issued: number;
  closed: boolean;
}
class CounterClosed extends Error {}
class SoldOut extends Error {}

const cap = 30;
const tickets: Decider<TicketState, TicketCommand, TicketEvent> = {
  initialState: () => ({ issued: 0, closed: false }),
  evolve(state, event) {
    switch (event.type) {
      case 'TicketIssued':
        return { ...state, issued: event.data.number };
      case 'CounterClosed':
        return { ...state, closed: true };
    }
  },
  decide(command, state) {
    switch (command.type) {
      case 'IssueTicket':
        if (state.closed) throw new CounterClosed();
        if (state.issued >= cap) throw new SoldOut();
        return { type: 'TicketIssued', data: { number: state.issued + 1, at: command.metadata.now }, id: command.metadata.id };
      case 'Close':
        return state.closed ? [] : [{ type: 'CounterClosed', data: { at: command.metadata.now } }];
      case 'Noop':
        return [];
      default: {
        const unhandled: never = command;
        throw new Error(`unknown command ${JSON.stringify(unhandled)}`);
      }
    }
  },
};

const issue = (id?: string): TicketCommand => ({ type: 'IssueTicket', metadata: { now: '2025-01-01T00:00:00Z', ...(id ? { id } : {}) } });
const stream = () => `counter-${randomUUID()}`;

const it = suite<{ store: EventStore }>('command handler');
it.before(async (context) => {
  context.store = await openEventStore({ inMemory: true });
});
it.after(async ({ store }) => {
  await store?.close();
});

it('decides on the stream state and appends the events with metadata', async ({ store }) => {
  const handler = new CommandHandler({ store });
  const id = stream();
  const first = await handler.handle(id, issue(), tickets, { metadata: { requestId: 'req-1' } });
  assert.equal(first.state, { issued: 1, closed: false });
  assert.is(first.version, 1);
  assert.is(first.newEvents.length, 1);
  const second = await handler.handle(id, issue(), tickets);
  assert.is(second.state.issued, 2);
  const read = await store.readStream(id);
  assert.equal(read.events.map((e) => [e.type, (e.data as { number: number }).number]), [['TicketIssued', 1], ['TicketIssued', 2]]);
  assert.equal(read.events[0].metadata, { requestId: 'req-1' });
});

it('a decision without events appends nothing', async ({ store }) => {
  const handler = new CommandHandler({ store });
  const id = stream();
  const result = await handler.handle(id, { type: 'Noop' }, tickets);
  assert.is(result.appended, null);
  assert.is(result.version, 0);
  await handler.handle(id, { type: 'Close', metadata: { now: 'x' } }, tickets);
  const again = await handler.handle(id, { type: 'Close', metadata: { now: 'y' } }, tickets);
  assert.is(again.appended, null);
  assert.is((await store.readStream(id)).version, 1);
});

it('a rejection is thrown to the caller and appends nothing', async ({ store }) => {
  const handler = new CommandHandler({ store });
  const id = stream();
  await handler.handle(id, { type: 'Close', metadata: { now: 'x' } }, tickets);
  try {
    await handler.handle(id, issue(), tickets);
    assert.unreachable();
  } catch (error) {
    assert.instance(error, CounterClosed);
  }
  assert.is((await store.readStream(id)).version, 1);
});

it('commands on one stream are serialized in the process: no conflicts, no lost updates', async ({ store }) => {
  let conflicts = 0;
  const counting: EventStore = {
    ...store,
    async append(...args) {
      try {
        return await store.append(...args);
      } catch (error) {
        if (error instanceof WrongExpectedVersion) conflicts++;
        throw error;
      }
    },
  };
  const handler = new CommandHandler({ store: counting, cacheSize: 0 }); // every command reads the stream
  const id = stream();
  const results = await Promise.all(Array.from({ length: 25 }, () => handler.handle(id, issue(), tickets)));
  assert.equal(results.map((r) => r.state.issued).sort((a, b) => a - b), Array.from({ length: 25 }, (_, i) => i + 1));
  assert.is(conflicts, 0);
});

it('another process writing first causes a conflict that is retried on fresh state', async ({ store }) => {
  // Two handlers with their own caches stand for two gateway processes.
  const here = new CommandHandler({ store });
  const there = new CommandHandler({ store });
  const id = stream();
  await here.handle(id, issue(), tickets); // here caches version 1
  await there.handle(id, issue(), tickets); // there reads version 1, appends 2
  const result = await here.handle(id, issue(), tickets); // stale cache: conflict, reload, decide again
  assert.is(result.state.issued, 3);
  assert.is(result.version, 3);
});

it('racing processes never exceed the cap: every decision is made on the state it appends onto', async ({ store }) => {
  // Three processes hammering one stream lose races often; enough attempts that none gives up.
  const handlers = [0, 1, 2].map(() => new CommandHandler({ store, maxAttempts: 100 }));
  const id = stream();
  const outcomes = await Promise.allSettled(Array.from({ length: 45 }, (_, i) => handlers[i % 3].handle(id, issue(), tickets)));
  assert.is(outcomes.filter((o) => o.status === 'fulfilled').length, cap);
  for (const o of outcomes) if (o.status === 'rejected') assert.instance(o.reason, SoldOut);
  const read = await store.readStream(id);
  assert.equal(read.events.map((e) => (e.data as { number: number }).number), Array.from({ length: cap }, (_, i) => i + 1));
});

it('a pinned expected version returns the conflict instead of retrying', async ({ store }) => {
  const handler = new CommandHandler({ store });
  const id = stream();
  await handler.handle(id, issue(), tickets);
  try {
    await handler.handle(id, issue(), tickets, { expectedVersion: 0 });
    assert.unreachable();
  } catch (error) {
    assert.instance(error, WrongExpectedVersion);
  }
  assert.is((await handler.load(id, tickets)).version, 1);
});

it('gives up after maxAttempts conflicts', async ({ store }) => {
  let attempts = 0;
  const alwaysConflicting: EventStore = {
    ...store,
    async append(streamId, _events, expected) {
      attempts++;
      throw new WrongExpectedVersion(streamId, expected, 99);
    },
  };
  const handler = new CommandHandler({ store: alwaysConflicting, maxAttempts: 3 });
  try {
    await handler.handle(stream(), issue(), tickets);
    assert.unreachable();
  } catch (error) {
    assert.instance(error, WrongExpectedVersion);
  }
  assert.is(attempts, 3);
});

it('an event id from the command makes a resent command harmless after a lost acknowledgement', async ({ store }) => {
  const id = stream();
  const eventId = randomUUID();
  await new CommandHandler({ store }).handle(id, issue(eventId), tickets);
  // A new process (fresh cache) that did not see the acknowledgement sends the same command at the same version.
  const resent = await store.append(id, [{ id: eventId, type: 'TicketIssued', data: { number: 1, at: '2025-01-01T00:00:00Z' } }], 0);
  assert.is(resent.idempotent, true);
  assert.is((await store.readStream(id)).version, 1);
});

it('loads long streams page by page', async ({ store }) => {
  const handler = new CommandHandler({ store, readPageSize: 7 });
  const id = stream();
  for (let i = 0; i < 20; i++) await store.append(id, [{ id: randomUUID(), type: 'TicketIssued', data: { number: i + 1, at: 'x' } }], i);
  const loaded = await handler.load(id, tickets);
  assert.equal(loaded, { state: { issued: 20, closed: false }, version: 20 });
});

it.run();
