/** Command handler: decide in memory, durable alongside, conflicts decided again, resends harmless. */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import { CommandHandler, commandIdKey, DecisionSuperseded, eventIdFor, type Outcome } from '../../src/command-handler/index.ts';
import { defineEvent, eventCatalogue, EventSchemaViolation, reject, Type, type Decider, type EventOf, type Rejection } from '../../src/event-sourcing/index.ts';
import { openEventStore, WrongExpectedVersion, type EventStore } from '../../src/store/index.ts';
import { deciderSpecification } from '../support/decider-specification.ts';

// A ticket counter with a cap: enough rules to see decisions made on stale and fresh state.
const TicketIssued = defineEvent('TicketIssued', Type.Object({ number: Type.Integer({ minimum: 1 }), at: Type.String() }), {
  version: 2,
  upcasters: { 1: (v1: { n: number; at: string }) => ({ number: v1.n, at: v1.at }) },
});
const CounterClosed = defineEvent('CounterClosed', Type.Object({ at: Type.String() }));
const NoteAdded = defineEvent('NoteAdded', Type.Object({ text: Type.String() }));
const ticketEvents = eventCatalogue('counter', [TicketIssued, CounterClosed, NoteAdded]);
type TicketEvent = EventOf<typeof TicketIssued> | EventOf<typeof CounterClosed> | EventOf<typeof NoteAdded>;
type TicketCommand = { type: 'IssueTicket'; now: string } | { type: 'Close'; now: string } | { type: 'Note'; text: string } | { type: 'Noop' };
interface TicketState {
  issued: number;
  closed: boolean;
}
type TicketRejection = Rejection<'counter_closed' | 'sold_out'>;

const cap = 30;
const tickets: Decider<TicketState, TicketCommand, TicketEvent, TicketRejection> = {
  events: ticketEvents,
  initialState: () => ({ issued: 0, closed: false }),
  evolve(state, event) {
    switch (event.type) {
      case 'TicketIssued':
        return { ...state, issued: event.data.number };
      case 'CounterClosed':
        return { ...state, closed: true };
      case 'NoteAdded':
        return state;
    }
  },
  decide(command, state) {
    switch (command.type) {
      case 'IssueTicket':
        if (state.closed) return reject('counter_closed', 'the counter is closed');
        if (state.issued >= cap) return reject('sold_out', 'no tickets left', { cap });
        return TicketIssued({ number: state.issued + 1, at: command.now });
      case 'Close':
        return state.closed ? [] : [CounterClosed({ at: command.now })];
      case 'Note':
        return NoteAdded({ text: command.text });
      case 'Noop':
        return [];
      default: {
        const unhandled: never = command;
        throw new Error(`unknown command ${JSON.stringify(unhandled)}`);
      }
    }
  },
};

const now = '2025-01-01T00:00:00Z';
const issue: TicketCommand = { type: 'IssueTicket', now };
const stream = () => `counter-${randomUUID()}`;

/** A store whose appends are counted (and can be made to fail) while still really appending. */
function counting(store: EventStore, failAfterCommit = 0) {
  const counts = { appends: 0, conflicts: 0 };
  let lostAcks = failAfterCommit;
  const wrapped: EventStore = {
    ...store,
    async append(...args) {
      counts.appends++;
      try {
        const result = await store.append(...args);
        if (lostAcks-- > 0) throw new Error('Connection terminated unexpectedly'); // stored, but the answer is lost
        return result;
      } catch (error) {
        if (error instanceof WrongExpectedVersion) counts.conflicts++;
        throw error;
      }
    },
  };
  return { store: wrapped, counts };
}

const spec = deciderSpecification(tickets);
const decider = suite('ticket decider (given / when / then)');
decider('issues the next number', () => spec.given([TicketIssued({ number: 1, at: now })]).when(issue).then([TicketIssued({ number: 2, at: now })]));
decider('refuses when closed', () => void spec.given([CounterClosed({ at: now })]).when(issue).thenRejects('counter_closed'));
decider('refuses past the cap, naming it', () => {
  void spec.given([TicketIssued({ number: cap, at: now })]).when(issue).thenRejects('sold_out', { cap });
});
decider('closing twice decides nothing', () => spec.given([CounterClosed({ at: now })]).when({ type: 'Close', now }).thenNothing());
decider.run();

const it = suite<{ store: EventStore }>('command handler');
it.before(async (context) => {
  context.store = await openEventStore({ inMemory: true });
});
it.after(async ({ store }) => {
  await store?.close();
});

it('decides on the stream state and appends checked events with the command id and schema version', async ({ store }) => {
  const handler = new CommandHandler({ store, origin: 'here' });
  const id = stream();
  const first = await handler.handle(id, issue, tickets, { metadata: { request_id: 'req-1' }, commandId: 'cmd-1' });
  assert.ok(first.accepted);
  assert.equal(first.state, { issued: 1, closed: false });
  assert.is(first.version, 1);
  assert.equal(first.newEvents, [TicketIssued({ number: 1, at: now })]);
  const second = await handler.handle(id, issue, tickets);
  assert.is(second.state.issued, 2);
  const read = await store.readStream(id);
  assert.equal(read.events.map((e) => [e.type, (e.data as { number: number }).number]), [['TicketIssued', 1], ['TicketIssued', 2]]);
  assert.equal(read.events[0].metadata, { request_id: 'req-1', [commandIdKey]: 'cmd-1', origin: 'here', schema_version: 2 });
  assert.is(read.events[0].id, eventIdFor('cmd-1', 0));
  // Ids are stored: they must never change for a command id (a resend after an upgrade appends nothing twice).
  assert.equal([eventIdFor('cmd-1', 0), eventIdFor('settle:req_abc', 1)], ['2d8b4069-ada5-5441-ac3e-ea78fa62b83b', '9f6b9f15-8c1d-57a0-82e1-eea46f461bee']);
});

it('a decision without events appends nothing', async ({ store }) => {
  const handler = new CommandHandler({ store });
  const id = stream();
  const result = await handler.handle(id, { type: 'Noop' }, tickets);
  assert.ok(result.accepted && result.newEvents.length === 0);
  assert.is(result.version, 0);
  await handler.handle(id, { type: 'Close', now }, tickets);
  const again = await handler.handle(id, { type: 'Close', now: 'later' }, tickets);
  assert.ok(again.accepted && again.newEvents.length === 0);
  assert.is((await store.readStream(id)).version, 1);
});

it('a rejection is a value, and appends nothing', async ({ store }) => {
  const handler = new CommandHandler({ store });
  const id = stream();
  await handler.handle(id, { type: 'Close', now }, tickets);
  const result = await handler.handle(id, issue, tickets);
  assert.not.ok(result.accepted);
  if (!result.accepted) assert.is(result.rejection.rejected, 'counter_closed');
  assert.is((await store.readStream(id)).version, 1);
});

it('a resent command returns its original result and appends nothing (after the cache is forgotten, and in a new process)', async ({ store }) => {
  const handler = new CommandHandler({ store });
  const id = stream();
  const original = await handler.handle(id, issue, tickets, { commandId: 'issue-once' });
  await handler.handle(id, issue, tickets); // the stream moves on
  handler.forget(id);
  const resent = await handler.handle(id, issue, tickets, { commandId: 'issue-once' });
  assert.ok(original.accepted && resent.accepted);
  assert.is(resent.resent, true);
  assert.is(resent.version, original.version);
  assert.equal(resent.newEvents, original.newEvents);
  const elsewhere = await new CommandHandler({ store }).handle(id, issue, tickets, { commandId: 'issue-once' });
  assert.ok(elsewhere.accepted && elsewhere.resent && elsewhere.version === 1);
  assert.is((await store.readStream(id)).version, 2);
});

it('remembers at most recentCommands command ids across all streams, the oldest forgotten first', async ({ store }) => {
  const { store: counted, counts } = counting(store);
  const handler = new CommandHandler({ store: counted, recentCommands: 3, recentCommandsPerStream: 1 });
  const [a, b] = [stream(), stream()];
  await handler.handle(a, { type: 'Note', text: 'one' }, tickets, { commandId: 'note-1' });
  await handler.handle(b, { type: 'Note', text: 'two' }, tickets, { commandId: 'note-2' });
  await handler.handle(a, { type: 'Note', text: 'three' }, tickets, { commandId: 'note-3' });
  // Still remembered: answered from memory, nothing sent to the store.
  const remembered = await handler.handle(b, { type: 'Note', text: 'two' }, tickets, { commandId: 'note-2' });
  assert.ok(remembered.accepted && remembered.resent);
  assert.is(counts.appends, 3);
  await handler.handle(b, { type: 'Note', text: 'four' }, tickets, { commandId: 'note-4' });
  // note-1 was the oldest of four: forgotten, so its resend goes to the store, which refuses its event ids.
  const forgotten = await handler.handle(a, { type: 'Note', text: 'one' }, tickets, { commandId: 'note-1' });
  assert.is(counts.appends, 5);
  assert.ok(forgotten.accepted && forgotten.resent, 'found in its stream and answered as resent');
  assert.is(forgotten.version, 1);
  assert.equal(forgotten.newEvents, [NoteAdded({ text: 'one' })]);
  assert.is((await store.readStream(a)).version, 2);
});

it('a resend of a command forgotten long ago, decided the same way on a later state, returns its original result', async ({ store }) => {
  const handler = new CommandHandler({ store, recentCommands: 1, recentCommandsPerStream: 0, maxAttempts: 3 });
  const id = stream();
  const original = await handler.handle(id, issue, tickets, { commandId: 'first-ticket' });
  for (let i = 0; i < 5; i++) await handler.handle(id, issue, tickets);
  // Decided again it would issue ticket 7, under the first one's event id: the store refuses that id,
  // and the command is found in the stream rather than fail after maxAttempts conflicts.
  const resent = await handler.handle(id, issue, tickets, { commandId: 'first-ticket' });
  assert.ok(original.accepted && resent.accepted && resent.resent);
  assert.is(resent.version, 1);
  assert.equal(resent.newEvents, original.newEvents);
  assert.is((await store.readStream(id)).version, 6);
  const next = await handler.handle(id, issue, tickets);
  assert.ok(next.accepted && next.version === 7, 'the stream goes on where it was');
});

it("each stream keeps its last recentCommandsPerStream command ids however busy the others are", async ({ store }) => {
  const { store: counted, counts } = counting(store);
  const handler = new CommandHandler({ store: counted, recentCommands: 2, recentCommandsPerStream: 1 });
  const [quiet, busy] = [stream(), stream()];
  await handler.handle(quiet, { type: 'Note', text: 'kept' }, tickets, { commandId: 'quiet-1' });
  for (let i = 0; i < 5; i++) await handler.handle(busy, { type: 'Note', text: `busy ${i}` }, tickets, { commandId: `busy-${i}` });
  const resent = await handler.handle(quiet, { type: 'Note', text: 'kept' }, tickets, { commandId: 'quiet-1' });
  assert.ok(resent.accepted && resent.resent);
  assert.is(counts.appends, 6, 'answered from memory');
  await handler.handle(busy, { type: 'Note', text: 'busy 0' }, tickets, { commandId: 'busy-0' });
  assert.is(counts.appends, 7, "the busy stream's oldest was forgotten");
});

it('a command resent by another process whose cache is stale is recognised after the conflict', async ({ store }) => {
  const here = new CommandHandler({ store });
  const there = new CommandHandler({ store });
  const id = stream();
  await there.load(id, tickets); // there caches version 0
  const original = await here.handle(id, issue, tickets, { commandId: 'cmd-x' });
  const resent = await there.handle(id, issue, tickets, { commandId: 'cmd-x' });
  assert.ok(original.accepted && resent.accepted && resent.resent);
  assert.is(resent.version, original.version);
  assert.is((await store.readStream(id)).version, 1);
});

it('the same command sent twice at once in one process shares one append', async ({ store }) => {
  const { store: counted, counts } = counting(store);
  const handler = new CommandHandler({ store: counted });
  const id = stream();
  const [a, b] = await Promise.all([handler.handle(id, issue, tickets, { commandId: 'twice' }), handler.handle(id, issue, tickets, { commandId: 'twice' })]);
  assert.ok(a.accepted && b.accepted);
  assert.is(a.version, b.version);
  assert.is(b.resent, true);
  assert.is(counts.appends, 1);
});

it('an append whose acknowledgement is lost is sent again with the same ids and succeeds once', async ({ store }) => {
  const { store: flaky, counts } = counting(store, 1);
  const handler = new CommandHandler({ store: flaky });
  const id = stream();
  const result = await handler.handle(id, issue, tickets);
  assert.ok(result.accepted && result.version === 1);
  assert.is(counts.appends, 2);
  assert.is((await store.readStream(id)).version, 1);
});

it('decisions are made in memory at once; 64 commands made in one turn take one append, not 64', async ({ store }) => {
  const { store: counted, counts } = counting(store);
  const handler = new CommandHandler({ store: counted });
  const id = stream();
  await handler.load(id, tickets);
  const decisions = await Promise.all(Array.from({ length: 64 }, (_, i) => handler.decide(id, { type: 'Note', text: `n${i}` }, tickets)));
  assert.equal(decisions.map((d) => d.outcome.version), Array.from({ length: 64 }, (_, i) => i + 1));
  assert.ok(counts.appends <= 1, 'decided before the first append came back');
  const outcomes = await Promise.all(decisions.map((d) => d.durable));
  assert.equal(outcomes.map((o) => o.version), Array.from({ length: 64 }, (_, i) => i + 1));
  assert.is(counts.appends, 1);
  assert.is((await store.readStream(id)).version, 64);
});

it('a lingering decision waits for its linger, or leaves at once with the next decision that may not wait', async ({ store }) => {
  const { store: counted, counts } = counting(store);
  const handler = new CommandHandler({ store: counted });
  const id = stream();
  await handler.load(id, tickets);
  const started = performance.now();
  const lingering = await handler.decide(id, { type: 'Note', text: 'settled' }, tickets, { lingerMs: 60 });
  await new Promise((r) => setTimeout(r, 20));
  assert.is(counts.appends, 0, 'not sent before its linger passed');
  await lingering.durable;
  assert.ok(performance.now() - started >= 55, 'sent once the linger passed');
  assert.is(counts.appends, 1);

  const first = await handler.decide(id, { type: 'Note', text: 'settled' }, tickets, { lingerMs: 60_000 });
  const urgent = await handler.decide(id, issue, tickets);
  const [a, b] = await Promise.all([first.durable, urgent.durable]);
  assert.equal([a.version, b.version], [2, 3]);
  assert.is(counts.appends, 2, 'the lingering decision left with the urgent one, in one append');
  await handler.settled();
});

it("a decision that may not wait takes along what lingers on other streams, into the store's same group commit", async ({ store }) => {
  const sent: string[] = [];
  const handler = new CommandHandler({ store: { ...store, append: (id, events, expected) => (sent.push(id), store.append(id, events, expected)) } });
  const [settledHere, reservedThere] = [stream(), stream()];
  await handler.load(settledHere, tickets);
  await handler.load(reservedThere, tickets);
  const lingering = await handler.decide(settledHere, { type: 'Note', text: 'settled' }, tickets, { lingerMs: 60_000 });
  assert.equal(sent, [], 'lingering');
  const urgent = await handler.decide(reservedThere, issue, tickets);
  assert.equal(sent, [], 'handed to the store from the next turn, after the caller has done its own work');
  await new Promise((resolve) => setImmediate(resolve));
  // Both reached the store together: its group commit sends them as one batch.
  assert.equal(sent.sort(), [settledHere, reservedThere].sort());
  const [a, b] = await Promise.all([lingering.durable, urgent.durable]);
  assert.equal([a.version, b.version], [1, 1]);
  await handler.settled();
});

it('pendingAppends.sendNow hands the pending decisions to the store at once, lingering ones along, and has it send them now', async ({ store }) => {
  const calls: string[] = [];
  const handler = new CommandHandler({
    store: {
      ...store,
      append: (id, events, expected) => (calls.push(`append ${id}`), store.append(id, events, expected)),
      sendAppendsNow: () => (calls.push('send now'), store.sendAppendsNow?.()),
    },
  });
  const [settledHere, reservedThere] = [stream(), stream()];
  await handler.load(settledHere, tickets);
  await handler.load(reservedThere, tickets);
  const lingering = await handler.decide(settledHere, { type: 'Note', text: 'settled' }, tickets, { lingerMs: 60_000 });
  const urgent = await handler.decide(reservedThere, issue, tickets);
  assert.equal(calls, [], 'nothing sent before the call');
  handler.pendingAppends.sendNow();
  assert.equal(calls.slice(0, 2).sort(), [`append ${settledHere}`, `append ${reservedThere}`].sort(), 'both handed over at the call');
  assert.equal(calls.slice(2), ['send now'], 'then the store is told to send them');
  const [a, b] = await Promise.all([lingering.durable, urgent.durable]);
  assert.equal([a.version, b.version], [1, 1]);
  assert.is(calls.length, 3, 'nothing handed over twice at the end of the turn');
  await handler.settled();
});

it("pendingAppends.holdForOneTurn lets a write the caller queued for the same turn go first; the decisions leave one turn later, or with sendNow", async ({ store }) => {
  const calls: string[] = [];
  const handler = new CommandHandler({ store: { ...store, append: (id, events, expected) => (calls.push('append'), store.append(id, events, expected)) } });
  const id = stream();
  await handler.load(id, tickets);
  // As the completion route does: decide, then queue its own write (undici's, from a setImmediate), then hold.
  const held = await handler.decide(id, issue, tickets);
  setImmediate(() => calls.push("the caller's write"));
  handler.pendingAppends.holdForOneTurn();
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(calls, ["the caller's write"], 'the append waits a turn');
  await held.durable;
  assert.equal(calls, ["the caller's write", 'append'], 'and leaves on its own with nobody calling sendNow');

  calls.length = 0;
  const sent = await handler.decide(id, issue, tickets);
  setImmediate(() => {
    calls.push("the caller's write");
    handler.pendingAppends.sendNow();
  });
  handler.pendingAppends.holdForOneTurn();
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(calls, ["the caller's write", 'append'], 'sendNow sends them at once, right after the write');
  await sent.durable;
  await new Promise((resolve) => setImmediate(resolve));
  assert.is(calls.length, 2, 'not sent twice');
  // Nothing pending: a hold is nothing, and the next decision leaves at the next turn as usual.
  handler.pendingAppends.holdForOneTurn();
  calls.length = 0;
  const next = await handler.decide(id, issue, tickets);
  await new Promise((resolve) => setImmediate(resolve));
  assert.equal(calls, ['append']);
  await next.durable;
});

it('commands on one stream never conflict with each other inside the process', async ({ store }) => {
  const { store: counted, counts } = counting(store);
  const handler = new CommandHandler({ store: counted, cacheSize: 0 });
  const id = stream();
  const results = await Promise.all(Array.from({ length: 25 }, () => handler.handle(id, issue, tickets)));
  assert.equal(results.map((r) => (r.accepted ? r.state.issued : 0)).sort((a, b) => a - b), Array.from({ length: 25 }, (_, i) => i + 1));
  assert.is(counts.conflicts, 0);
});

it('another process writing first: the command is decided again on fresh state', async ({ store }) => {
  const here = new CommandHandler({ store });
  const there = new CommandHandler({ store });
  const id = stream();
  await here.handle(id, issue, tickets); // here caches version 1
  await there.handle(id, issue, tickets); // there reads version 1, appends 2
  const decision = await here.decide(id, issue, tickets); // stale: decided as ticket 2
  assert.is(decision.outcome.version, 2);
  const result = await decision.durable;
  assert.ok(result.accepted);
  assert.is(result.state.issued, 3);
  assert.is(result.version, 3);
  assert.ok(decision.superseded.aborted, 'the first decision (ticket 2) was void');
  assert.instance(decision.superseded.reason, DecisionSuperseded);
});

it('load({ fresh: true }) reads what another process appended, once, and returns (cached or not)', async ({ store }) => {
  const stream = `counter-${randomUUID()}`;
  const a = new CommandHandler({ store });
  const b = new CommandHandler({ store });
  await a.handle(stream, issue, tickets);
  assert.is((await a.load(stream, tickets, { fresh: true })).version, 1, 'a cached stream');
  await b.handle(stream, issue, tickets);
  const fresh = await a.load(stream, tickets, { fresh: true });
  assert.is(fresh.version, 2, "sees the other process's append");
  assert.is(fresh.state.issued, 2);
  assert.is((await b.load(`counter-${randomUUID()}`, tickets, { fresh: true })).version, 0, 'a stream loaded by this very call');
});

it('a decision that stands on fresh state is not superseded', async ({ store }) => {
  const here = new CommandHandler({ store });
  const there = new CommandHandler({ store });
  const id = stream();
  await here.load(id, tickets);
  await there.handle(id, { type: 'Note', text: 'there' }, tickets);
  const decision = await here.decide(id, { type: 'Note', text: 'here' }, tickets);
  const result = await decision.durable;
  assert.is(result.version, 2);
  assert.not.ok(decision.superseded.aborted);
});

it('a conflict that turns an acceptance into a rejection tells the caller', async ({ store }) => {
  const here = new CommandHandler({ store });
  const there = new CommandHandler({ store });
  const id = stream();
  for (let i = 0; i < cap - 1; i++) await here.handle(id, { type: 'IssueTicket', now }, tickets);
  await there.handle(id, issue, tickets); // the last ticket goes elsewhere
  const decision = await here.decide(id, issue, tickets);
  assert.ok(decision.outcome.accepted, 'decided on stale state');
  const final = await decision.durable;
  assert.not.ok(final.accepted);
  if (!final.accepted) assert.is(final.rejection.rejected, 'sold_out');
  assert.ok(decision.superseded.aborted);
  assert.is((await store.readStream(id)).version, cap);
});

it('a refusal made on top of a decision that loses its race is decided again, not answered', async ({ store }) => {
  const here = new CommandHandler({ store });
  const there = new CommandHandler({ store });
  const id = stream();
  for (let i = 0; i < cap - 1; i++) await here.handle(id, issue, tickets);
  await there.handle(id, { type: 'Close', now }, tickets); // here does not know yet
  const last = await here.decide(id, issue, tickets); // on stale state: the last ticket
  const after = await here.decide(id, issue, tickets); // on top of it, not stored yet: sold out
  assert.ok(last.outcome.accepted);
  assert.is(!after.outcome.accepted && after.outcome.rejection.rejected, 'sold_out');
  const [lastFinal, afterFinal] = await Promise.all([last.durable, after.durable]);
  assert.is(!lastFinal.accepted && lastFinal.rejection.rejected, 'counter_closed');
  // Sold out counted a ticket the store never held: the refusal the caller gets is the store's reason.
  assert.is(!afterFinal.accepted && afterFinal.rejection.rejected, 'counter_closed');
  assert.ok(after.superseded.aborted, 'the first refusal was void');
  assert.is((await store.readStream(id)).version, cap);
});

it('a refusal or a no-op decided on top of unstored decisions is final only once they are stored', async ({ store }) => {
  const handler = new CommandHandler({ store });
  const id = stream();
  for (let i = 0; i < cap - 1; i++) await handler.handle(id, issue, tickets);
  const order: string[] = [];
  const last = await handler.decide(id, issue, tickets);
  const refused = await handler.decide(id, issue, tickets);
  const noop = await handler.decide(id, { type: 'Noop' }, tickets);
  await Promise.all([
    last.durable.then(() => order.push('stored')),
    refused.durable.then((o) => order.push(o.accepted ? 'accepted' : o.rejection.rejected)),
    noop.durable.then(() => order.push('noop')),
  ]);
  assert.equal(order, ['stored', 'sold_out', 'noop']);
  assert.not.ok(refused.superseded.aborted);
  // With nothing under way, a refusal is final at once (resolved before any store round trip).
  let settled = false;
  void (await handler.decide(id, issue, tickets)).durable.then(() => (settled = true));
  await Promise.resolve();
  assert.ok(settled);
});

it('racing processes never exceed the cap: every decision is made on the state it appends onto', async ({ store }) => {
  const handlers = [0, 1, 2].map(() => new CommandHandler({ store }));
  const id = stream();
  const outcomes = await Promise.all(Array.from({ length: 45 }, (_, i) => handlers[i % 3].handle(id, issue, tickets)));
  assert.is(outcomes.filter((o) => o.accepted).length, cap);
  for (const o of outcomes) if (!o.accepted) assert.is(o.rejection.rejected, 'sold_out');
  const read = await store.readStream(id);
  assert.equal(read.events.map((e) => (e.data as { number: number }).number), Array.from({ length: cap }, (_, i) => i + 1));
});

it('three processes writing one hot stream without pause: every command is stored, none fails for losing races', async ({ store }) => {
  const handlers = [0, 1, 2].map(() => new CommandHandler({ store }));
  for (const handler of handlers) await handler.followLog();
  const id = stream();
  const failures: unknown[] = [];
  await Promise.all(
    handlers.map(async (handler) => {
      for (let wave = 0; wave < 20; wave++) {
        await Promise.all(
          Array.from({ length: 25 }, () =>
            handler.handle(id, { type: 'Note', text: 'x' }, tickets).catch((error: unknown) => void failures.push(error)),
          ),
        );
      }
    }),
  );
  assert.is(failures.length, 0, `${failures.length} failed, first: ${String(failures[0])}`);
  assert.is((await store.readStream(id)).version, 3 * 20 * 25);
});

it('a pinned expected version fails with the conflict instead of deciding again', async ({ store }) => {
  const handler = new CommandHandler({ store });
  const id = stream();
  await handler.handle(id, issue, tickets);
  try {
    await handler.handle(id, issue, tickets, { expectedVersion: 0 });
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
  const decision = await handler.decide(stream(), issue, tickets);
  try {
    await decision.durable;
    assert.unreachable();
  } catch (error) {
    assert.instance(error, WrongExpectedVersion);
  }
  assert.is(attempts, 3);
  assert.ok(decision.superseded.aborted);
});

it('only commands that were sent are charged for a lost race, not those waiting behind them', async ({ store }) => {
  let lose = 2;
  const losingTwice: EventStore = {
    ...store,
    async append(streamId, events, expected) {
      if (lose-- > 0) throw new WrongExpectedVersion(streamId, expected, 99);
      return store.append(streamId, events, expected);
    },
  };
  const handler = new CommandHandler({ store: losingTwice, maxAttempts: 2 });
  const id = stream();
  await handler.load(id, tickets);
  // The first is sent (from the next turn) and loses twice; the other two, decided once it is on its
  // way, wait behind it, then go out together once.
  const first = handler.decide(id, issue, tickets);
  await first;
  await new Promise((resolve) => setImmediate(resolve));
  const waiting = [1, 2].map(() => handler.decide(id, issue, tickets));
  const outcomes = await Promise.allSettled([first, ...waiting].map(async (d) => (await d).durable));
  assert.is(outcomes[0].status, 'rejected', 'the command sent twice lost both races');
  assert.equal(outcomes.slice(1).map((o) => o.status), ['fulfilled', 'fulfilled']);
  assert.is((await store.readStream(id)).version, 2);
});

it('stored events are checked and upcast before evolve sees them', async ({ store }) => {
  const handler = new CommandHandler({ store });
  const id = stream();
  await store.append(id, [{ id: randomUUID(), type: 'TicketIssued', data: { n: 7, at: now } }], 0); // version 1 data, no schema_version
  assert.equal((await handler.load(id, tickets)).state, { issued: 7, closed: false });
  const broken = stream();
  await store.append(broken, [{ id: randomUUID(), type: 'TicketIssued', data: { number: 'seven', at: now }, metadata: { schema_version: 2 } }], 0);
  try {
    await handler.load(broken, tickets);
    assert.unreachable();
  } catch (error) {
    assert.instance(error, EventSchemaViolation);
  }
});

it('a decider whose event breaks its schema never reaches the log', async ({ store }) => {
  const sloppy: typeof tickets = { ...tickets, decide: () => ({ type: 'TicketIssued', data: { number: 0, at: now } }) };
  const handler = new CommandHandler({ store });
  const id = stream();
  try {
    await handler.decide(id, issue, sloppy);
    assert.unreachable();
  } catch (error) {
    assert.instance(error, EventSchemaViolation);
  }
  assert.is((await store.readStream(id)).version, 0);
});

it('settled() waits for every decision under way', async ({ store }) => {
  const handler = new CommandHandler({ store });
  const id = stream();
  const decisions = await Promise.all(Array.from({ length: 10 }, () => handler.decide(id, issue, tickets)));
  await handler.settled();
  assert.is((await store.readStream(id)).version, 10);
  assert.is((await decisions[9].durable).version, 10);
});

it("following the log: another process's write makes the next decision read it first, without a conflict", async ({ store }) => {
  const { store: counted, counts } = counting(store);
  const here = new CommandHandler({ store: counted });
  const there = new CommandHandler({ store });
  const id = stream();
  await here.handle(id, issue, tickets);
  const subscription = await here.followLog();
  const seen: string[] = [];
  here.onForeignEvent((event) => seen.push(event.streamId));
  try {
    await here.handle(id, issue, tickets); // our own write is not foreign
    await there.handle(id, issue, tickets);
    await store.readable();
    await subscription.caughtUp();
    assert.equal(seen, [id]);
    const result = await here.handle(id, issue, tickets);
    assert.ok(result.accepted && result.version === 4);
    assert.is(counts.conflicts, 0);
  } finally {
    await subscription.stop();
  }
});

it('a decision is never made on the state a catch-up is replacing (one whose caller resumes while a fresh load reads)', async ({ store }) => {
  // Forced interleaving: a decision and a fresh load both wait on one catch-up; when it ends, the load
  // starts another before the decision's caller resumes, and another process appends before that read.
  // Decided in between, the decision would stand on the state before that append and be sent after it.
  let beforeRead: (() => Promise<unknown>) | null = null;
  const hooked: EventStore = {
    ...store,
    async readStream(...args) {
      const hook = beforeRead;
      beforeRead = null;
      await hook?.();
      return store.readStream(...args);
    },
  };
  const here = new CommandHandler({ store: hooked });
  const there = new CommandHandler({ store });
  const id = stream();
  for (let i = 0; i < cap - 2; i++) await here.handle(id, issue, tickets);
  let elsewhere: Promise<Outcome<TicketState, TicketEvent, TicketRejection>> | null = null;
  const first = here.load(id, tickets, { fresh: true }); // a catch-up under way
  beforeRead = () => (elsewhere = there.handle(id, issue, tickets)); // another process appends before this process's next read
  const racing = here.handle(id, issue, tickets); // waits on the catch-up
  const fresh = here.load(id, tickets, { fresh: true }); // waits on it too, then reads again
  await Promise.all([first, fresh]);
  const last = here.handle(id, issue, tickets);
  const outcomes = await Promise.all([racing, last, elsewhere ?? there.handle(id, issue, tickets)]);
  assert.is(outcomes.filter((o) => o.accepted).length, 2, JSON.stringify(outcomes));
  const read = await store.readStream(id);
  assert.equal(read.events.map((e) => (e.data as { number: number }).number), Array.from({ length: cap }, (_, i) => i + 1));
});

it('a fresh load reads what another process appended since', async ({ store }) => {
  const here = new CommandHandler({ store });
  const there = new CommandHandler({ store });
  const id = stream();
  await here.handle(id, issue, tickets);
  await there.handle(id, issue, tickets);
  assert.is((await here.load(id, tickets)).version, 1, 'the cache alone does not know');
  assert.is((await here.load(id, tickets, { fresh: true })).version, 2);
});

it('loads long streams page by page', async ({ store }) => {
  const handler = new CommandHandler({ store, readPageSize: 7 });
  const id = stream();
  for (let i = 0; i < 20; i++) await store.append(id, [{ id: randomUUID(), type: 'TicketIssued', data: { number: i + 1, at: 'x' }, metadata: { schema_version: 2 } }], i);
  const loaded = await handler.load(id, tickets);
  assert.equal(loaded, { state: { issued: 20, closed: false }, version: 20 });
});

it.run();
