/**
 * The event log contract: what every `EventLog` adapter passes, the SQL ones (PGlite, PostgreSQL; run
 * from contract.test.ts beside their SQL-only tests) and EventStoreDB (eventstoredb.test.ts, when
 * EVENTSTORE_URL is set). Only the log port is used here: no transactions, no SQL.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import {
  DuplicateEventId,
  InvalidEvent,
  WrongExpectedVersion,
  type EventLog,
  type GlobalPosition,
  type RecordedEvent,
} from '../../src/store/index.ts';
import { deferred, event, uniqueStream } from './adapters.ts';
import { within } from '../support/within.ts';

/** A log under test. */
export interface LogUnderTest {
  name: string;
  /** Opens a log; on a server every call opens another instance on the same log (another process, as far as the server knows). */
  open(): Promise<EventLog>;
  /** Whether `open` gives a second instance on the same log (PostgreSQL, EventStoreDB; not an in-memory PGlite). */
  instances: boolean;
  /** Event ids are unique across the whole log (the SQL adapters), not only at their place in a stream (EventStoreDB). */
  uniqueEventIds: boolean;
}

/**
 * The bound on every wait for the store to do something by itself (wake a reader, make a commit readable,
 * end a transaction that waits on another): a test whose wake-up is lost fails here within seconds and
 * the tests after it still run, instead of the runner killing the whole file after minutes.
 */
export const waitLimitMs = 5_000;

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export async function rejectsWith<E extends Error>(promise: Promise<unknown>, type: new (...args: never[]) => E): Promise<E> {
  try {
    await promise;
  } catch (error) {
    assert.instance(error, type);
    return error as E;
  }
  return assert.unreachable(`expected a ${type.name}`) as never;
}

/** The head once everything committed so far is readable, so a test's "start" is not behind earlier tests' events. */
export async function settledHead(store: EventLog): Promise<GlobalPosition> {
  await within(waitLimitMs, store.readable(), 'store.readable() before a test starts');
  return store.head();
}

export async function readEverythingAfter(store: EventLog, after = store.start): Promise<RecordedEvent[]> {
  await within(waitLimitMs, store.readable(), 'store.readable() before reading the log');
  const all: RecordedEvent[] = [];
  for (let position = after; ; ) {
    const batch = await store.readAll(position, 100);
    if (batch.length === 0) return all;
    all.push(...batch);
    position = batch[batch.length - 1].globalPosition;
  }
}

/** Registers and runs the contract's suite on `target`. */
export function logContract(target: LogUnderTest): void {
  const it = suite<{ store: EventLog }>(`event log contract (${target.name})`);

  it.before(async (context) => {
    context.store = await target.open();
  });

  it.after(async (context) => {
    await context.store?.close();
  });

  it('appends to a new stream and reads it back in order', async ({ store }) => {
    const stream = uniqueStream();
    const events = [event('A', { n: 1 }, { requestId: 'r1' }), event('B', { n: 2 })];
    const result = await store.append(stream, events, 'no_stream');
    assert.is(result.nextExpectedVersion, 2);
    assert.is(result.idempotent, false);
    const read = await store.readStream(stream);
    assert.is(read.version, 2);
    assert.equal(read.events.map((e) => [e.id, e.type, e.data, e.streamVersion]), [
      [events[0].id, 'A', { n: 1 }, 1],
      [events[1].id, 'B', { n: 2 }, 2],
    ]);
    assert.equal(read.events[0].metadata, { requestId: 'r1' });
    assert.equal(read.events[1].metadata, {});
    assert.is(store.comparePositions(read.events[1].globalPosition, result.lastPosition), 0);
    assert.instance(read.events[0].recordedAt, Date);
  });

  it('reads a stream from a version, with a limit, and an unknown stream as version 0', async ({ store }) => {
    const stream = uniqueStream();
    await store.append(stream, [event('A'), event('B'), event('C'), event('D')], 'no_stream');
    const tail = await store.readStream(stream, { fromVersion: 2, limit: 2 });
    assert.is(tail.version, 4);
    assert.equal(tail.events.map((e) => e.type), ['B', 'C']);
    const beyond = await store.readStream(stream, { fromVersion: 9 });
    assert.equal(beyond, { version: 4, events: [] });
    assert.equal(await store.readStream(uniqueStream()), { version: 0, events: [] });
  });

  it('reads the versions of many streams at once, 0 for those with no events', async ({ store }) => {
    const [a, b, none] = [uniqueStream(), uniqueStream(), uniqueStream()];
    await store.append(a, [event('A'), event('B')], 'no_stream');
    await store.append(b, [event('A')], 'no_stream');
    const versions = await store.streamVersions([none, a, b]);
    assert.is(versions.size, 3);
    assert.equal([versions.get(none), versions.get(a), versions.get(b)], [0, 2, 1]);
    assert.is((await store.streamVersions([])).size, 0);
  });

  it('expected version any appends whatever the stream holds', async ({ store }) => {
    const stream = uniqueStream();
    assert.is((await store.append(stream, [event()], 'any')).nextExpectedVersion, 1);
    assert.is((await store.append(stream, [event()], 'any')).nextExpectedVersion, 2);
  });

  it('expected version no_stream conflicts once the stream exists', async ({ store }) => {
    const stream = uniqueStream();
    await store.append(stream, [event()], 'no_stream');
    const error = await rejectsWith(store.append(stream, [event()], 'no_stream'), WrongExpectedVersion);
    assert.is(error.streamId, stream);
    assert.is(error.expected, 'no_stream');
    assert.is(error.actual, 1);
  });

  it('expected version stream_exists conflicts on a missing stream, appends to an existing one', async ({ store }) => {
    const stream = uniqueStream();
    const error = await rejectsWith(store.append(stream, [event()], 'stream_exists'), WrongExpectedVersion);
    assert.is(error.actual, 0);
    await store.append(stream, [event()], 'no_stream');
    assert.is((await store.append(stream, [event()], 'stream_exists')).nextExpectedVersion, 2);
  });

  it('expected version N appends only at version N', async ({ store }) => {
    const stream = uniqueStream();
    await rejectsWith(store.append(stream, [event()], 3), WrongExpectedVersion);
    assert.is((await store.append(stream, [event()], 0)).nextExpectedVersion, 1);
    assert.is((await store.append(stream, [event(), event()], 1)).nextExpectedVersion, 3);
    const error = await rejectsWith(store.append(stream, [event()], 1), WrongExpectedVersion);
    assert.is(error.expected, 1);
    assert.is(error.actual, 3);
  });

  it('a multi-event append is atomic: a conflicting one writes none of its events', async ({ store }) => {
    const stream = uniqueStream();
    await store.append(stream, [event('A')], 'no_stream');
    await rejectsWith(store.append(stream, [event('X'), event('Y'), event('Z')], 0), WrongExpectedVersion);
    const read = await store.readStream(stream);
    assert.is(read.version, 1);
    assert.equal(read.events.map((e) => e.type), ['A']);
  });

  it('appending the same event ids again at the same expected version is an idempotent success', async ({ store }) => {
    const stream = uniqueStream();
    const first = [event('A'), event('B')];
    await store.append(stream, [event('Opened')], 'no_stream');
    const original = await store.append(stream, first, 1);
    const again = await store.append(stream, first, 1);
    assert.is(again.idempotent, true);
    assert.is(again.nextExpectedVersion, original.nextExpectedVersion);
    assert.equal(again.lastPosition, original.lastPosition);
    const noStream = uniqueStream();
    const opening = [event('Opened')];
    await store.append(noStream, opening, 'no_stream');
    assert.is((await store.append(noStream, opening, 'no_stream')).idempotent, true);
    assert.is((await store.append(noStream, opening, 'any')).idempotent, true);
    const read = await store.readStream(stream);
    assert.equal(read.events.map((e) => e.type), ['Opened', 'A', 'B']);
  });

  if (!target.uniqueEventIds) it.skip(`event ids reused at another place are a typed error: not applicable, ${target.name} keeps event ids unique per place, not across the log`, () => {});
  else it('event ids reused at another place are a typed error, not a silent success', async ({ store }) => {
    const stream = uniqueStream();
    const used = event('A');
    await store.append(stream, [used], 'no_stream');
    await rejectsWith(store.append(stream, [used], 1), DuplicateEventId);
    await rejectsWith(store.append(uniqueStream(), [used], 'any'), DuplicateEventId);
    await rejectsWith(store.append(stream, [event('B'), used], 1), DuplicateEventId);
    // a partial match is not a repeat: the new event would be silently dropped
    await rejectsWith(store.append(stream, [used, event('New')], 0), DuplicateEventId);
    await rejectsWith(store.append(stream, [used, event('New')], 'any'), DuplicateEventId);
    assert.is((await store.readStream(stream)).version, 1);
  });

  it('rejects malformed appends before they reach the database', async ({ store }) => {
    await rejectsWith(store.append(uniqueStream(), [], 'any'), TypeError);
    await rejectsWith(store.append(uniqueStream(), [{ id: 'not-a-uuid', type: 'A', data: {} }], 'any'), TypeError);
    await rejectsWith(store.append(uniqueStream(), [event()], -1), TypeError);
    const twice = event();
    await rejectsWith(store.append(uniqueStream(), [twice, twice], 'any'), TypeError);
  });

  it('readAll returns the global log in commit order, paged by position', async ({ store }) => {
    const start = await settledHead(store);
    const a = uniqueStream();
    const b = uniqueStream();
    await store.append(a, [event('A1'), event('A2')], 'no_stream');
    await store.append(b, [event('B1')], 'no_stream');
    await store.append(a, [event('A3')], 2);
    await within(waitLimitMs, store.readable(), 'our commits readable'); // other transactions on the server may still hide them for a moment
    const firstPage = await store.readAll(start, 2);
    assert.equal(firstPage.map((e) => e.type), ['A1', 'A2']);
    const rest = await store.readAll(firstPage[1].globalPosition, 10);
    assert.equal(rest.map((e) => e.type), ['B1', 'A3']);
    const head = await store.head();
    assert.equal(head, rest[1].globalPosition);
    assert.is(await store.countAfter(start), 4);
    assert.is(await store.countAfter(head), 0);
  });

  it('many concurrent appends all land, each once, and a conflict fails only its own append (the SQL adapters: one group commit)', async ({ store }) => {
    const start = await settledHead(store);
    const streams = Array.from({ length: 100 }, () => uniqueStream());
    const results = await Promise.allSettled(
      streams.map((s, i) => store.append(s, [event('G', { i }), event('G', { i })], i === 50 ? 7 : 'no_stream')),
    );
    assert.is(results.filter((r) => r.status === 'fulfilled').length, 99);
    assert.instance((results[50] as PromiseRejectedResult).reason, WrongExpectedVersion);
    const written = await readEverythingAfter(store, start);
    assert.is(written.length, 198);
    assert.is(new Set(written.map((e) => e.id)).size, 198);
  });

  it('a few one-event appends made together all land, and a conflict or a reused event id fails only its own append (the SQL adapters: one batch)', async ({ store }) => {
    const start = await settledHead(store);
    const [a, b, c] = [uniqueStream(), uniqueStream(), uniqueStream()];
    await store.append(b, [event('B1')], 'no_stream');
    const first = await Promise.all([store.append(a, [event('A1')], 'no_stream'), store.append(b, [event('B2')], 1), store.append(c, [event('C1')], 'no_stream')]);
    assert.equal(first.map((r) => r.nextExpectedVersion), [1, 2, 1]);
    const second = await Promise.allSettled([store.append(a, [event('A2')], 1), store.append(b, [event('B3')], 5), store.append(c, [event('C2')], 1), store.append(uniqueStream(), [event('D1')], 3)]);
    assert.equal(second.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled', 'rejected']);
    assert.instance((second[1] as PromiseRejectedResult).reason, WrongExpectedVersion);
    assert.instance((second[3] as PromiseRejectedResult).reason, WrongExpectedVersion);
    const written = await readEverythingAfter(store, start);
    assert.equal(written.map((e) => e.type).sort(), ['A1', 'A2', 'B1', 'B2', 'C1', 'C2']);
    assert.equal((await store.readStream(b)).events.map((e) => [e.type, e.streamVersion]), [['B1', 1], ['B2', 2]]);
    if (target.uniqueEventIds) {
      const shared = event('S1');
      const [kept, refused] = await Promise.allSettled([store.append(uniqueStream(), [shared], 'no_stream'), store.append(uniqueStream(), [{ ...shared, type: 'S2' }], 'no_stream')]);
      assert.is(kept.status, 'fulfilled', 'the first caller keeps the event id');
      assert.instance((refused as PromiseRejectedResult).reason, DuplicateEventId);
    }
  });

  it('concurrent appends to one stream keep their call order', async ({ store }) => {
    const stream = uniqueStream();
    await Promise.all(Array.from({ length: 20 }, (_, i) => store.append(stream, [event('N', { i })], 'any')));
    const read = await store.readStream(stream);
    assert.equal(read.events.map((e) => (e.data as { i: number }).i), Array.from({ length: 20 }, (_, i) => i));
  });

  it('two writers racing on one stream: exactly one wins', async ({ store }) => {
    for (let round = 0; round < 10; round++) {
      const stream = uniqueStream();
      await store.append(stream, [event()], 'no_stream');
      const results = await Promise.allSettled([store.append(stream, [event('X')], 1), store.append(stream, [event('Y')], 1)]);
      assert.is(results.filter((r) => r.status === 'fulfilled').length, 1);
      const loser = results.find((r) => r.status === 'rejected') as PromiseRejectedResult;
      assert.instance(loser.reason, WrongExpectedVersion);
      assert.is((await store.readStream(stream)).version, 2);
    }
    if (target.instances) {
      // two processes' worth of connections, racing in the database rather than in one queue
      const other = await target.open();
      try {
        for (let round = 0; round < 20; round++) {
          const stream = uniqueStream();
          const results = await Promise.allSettled([store.append(stream, [event('X')], 'no_stream'), other.append(stream, [event('Y')], 'no_stream')]);
          assert.is(results.filter((r) => r.status === 'fulfilled').length, 1, `round ${round}`);
          assert.instance((results.find((r) => r.status === 'rejected') as PromiseRejectedResult).reason, WrongExpectedVersion);
          assert.is((await store.readStream(stream)).events.length, 1);
        }
        // multi-event appends of different sizes: the loser leaves none of its events behind
        for (let round = 0; round < 20; round++) {
          const stream = uniqueStream();
          const mine = [event('X1'), event('X2')];
          const results = await Promise.allSettled([store.append(stream, mine, 'no_stream'), other.append(stream, [event('Y1')], 'no_stream')]);
          assert.is(results.filter((r) => r.status === 'fulfilled').length, 1, `round ${round}`);
          const types = (await store.readStream(stream)).events.map((e) => e.type);
          assert.ok(types.join() === 'X1,X2' || types.join() === 'Y1', types.join());
        }
      } finally {
        await other.close();
      }
    }
  });

  it('writers racing with expected version any all land, in some order, without gaps', async ({ store }) => {
    const other = target.instances ? await target.open() : store;
    try {
      const stream = uniqueStream();
      const appends = Array.from({ length: 40 }, (_, i) => (i % 2 ? other : store).append(stream, [event('A', { i }), event('B', { i })], 'any'));
      await Promise.all(appends);
      const read = await store.readStream(stream);
      assert.is(read.version, 80);
      assert.equal(read.events.map((e) => e.streamVersion), Array.from({ length: 80 }, (_, i) => i + 1));
      // each append's two events stay next to each other
      for (let v = 0; v < 80; v += 2) assert.equal(read.events[v].data, read.events[v + 1].data);
    } finally {
      if (other !== store) await other.close();
    }
  });

  it('a live subscription catches up, then is woken within 50 ms of a commit', async ({ store }) => {
    const start = await settledHead(store);
    const stream = uniqueStream();
    await store.append(stream, [event('Before')], 'no_stream');
    // A second instance is another process as far as the server knows: woken by it (PostgreSQL's NOTIFY, EventStoreDB's live subscription).
    const reader = target.instances ? await target.open() : store;
    try {
      const received: string[] = [];
      let woken = deferred<number>();
      const subscription = reader.subscribe({
        after: start,
        pollIntervalMs: 60_000, // only a wake-up hint can wake it in time
        async handle(events) {
          received.push(...events.map((e) => e.type));
          if (events.some((e) => e.type === 'Live')) woken.resolve(performance.now());
        },
      });
      await within(waitLimitMs, subscription.caughtUp(), 'the subscriber catching up');
      assert.equal(received, ['Before']);
      const latencies: number[] = [];
      for (let i = 0; i < 5; i++) {
        woken = deferred<number>();
        const committedAt = performance.now();
        await store.append(stream, [event('Live')], i + 1);
        latencies.push((await within(waitLimitMs, woken.promise, `the subscriber woken by commit ${i + 1} of 5 (its poll is a minute away: the wake-up hint was lost)`)) - committedAt);
      }
      await subscription.stop();
      assert.is(received.length, 6);
      // Every wake-up came from the hint (the polling fallback is a minute away), and the fastest of
      // five shows its speed: scheduling hiccups on a loaded machine (a CI runner starting every test
      // file at once) delay single wake-ups, not all five.
      const shown = latencies.map((l) => l.toFixed(1)).join(', ');
      assert.ok(Math.max(...latencies) < 5_000, `woken after ${shown} ms`);
      assert.ok(Math.min(...latencies) < 50, `woken after ${shown} ms`);
    } finally {
      if (reader !== store) await reader.close();
    }
  });

  it('a subscriber with skipMetadata is handed only the other events, whole, and moves past the skipped ones', async ({ store }) => {
    const start = await settledHead(store);
    const stream = uniqueStream();
    await store.append(stream, [event('Mine', { n: 1 }, { origin: 'me' }), event('Theirs', { n: 2 }, { origin: 'them' }), event('Unmarked', { n: 3 })], 'no_stream');
    await store.append(stream, [event('Mine', { n: 4 }, { origin: 'me' })], 3);
    const handed: RecordedEvent[][] = [];
    const subscription = store.subscribe({ after: start, skipMetadata: { key: 'origin', value: 'me' }, handle: async (events) => void handed.push(events) });
    await within(waitLimitMs, subscription.caughtUp(), 'the subscriber catching up');
    await subscription.stop();
    const seen = handed.flat().filter((e) => e.streamId === stream);
    assert.equal(seen.map((e) => [e.type, e.data, e.metadata.origin ?? null, e.streamVersion]), [['Theirs', { n: 2 }, 'them', 2], ['Unmarked', { n: 3 }, null, 3]]);
    assert.ok(handed.every((batch) => batch.length > 0), 'a batch of skipped events only is not handed over');
    assert.is(store.comparePositions(subscription.position, (await store.readAll(start, 10)).at(-1)!.globalPosition), 0, 'the position moved past the last, skipped event');
  });

  it('a subscriber with gatherMs takes what committed during its pause in one batch, and reads the first event after a quiet spell at once', async ({ store }) => {
    const stream = uniqueStream();
    const batches: string[][] = [];
    const first = deferred<void>();
    const subscription = store.subscribe({
      after: await settledHead(store),
      gatherMs: 400,
      async handle(events) {
        const mine = events.filter((e) => e.streamId === stream).map((e) => e.type);
        if (mine.length > 0) batches.push(mine);
        if (mine.includes('One')) first.resolve();
      },
    });
    await within(waitLimitMs, subscription.caughtUp(), 'the subscriber catching up');
    await store.append(stream, [event('One')], 'no_stream');
    await within(waitLimitMs, first.promise, 'the first event delivered');
    // Committed one by one while the subscriber pauses after its batch: read together.
    await store.append(stream, [event('Two')], 1);
    await store.append(stream, [event('Three')], 2);
    await within(waitLimitMs, subscription.caughtUp(), 'the subscriber taking what committed during its pause');
    await subscription.stop();
    assert.equal(batches, [['One'], ['Two', 'Three']]);
  });
  it('a partial repeat of stored ids at their place is a typed error, not a silent success', async ({ store }) => {
    const stream = uniqueStream();
    const used = event('A');
    await store.append(stream, [used], 'no_stream');
    // the new event would be silently dropped if this were taken for a repeat
    await rejectsWith(store.append(stream, [used, event('New')], 0), DuplicateEventId);
    await rejectsWith(store.append(stream, [used, event('New')], 'any'), DuplicateEventId);
    // a conflict whose next event is another's stays a conflict
    await store.append(stream, [event('B')], 1);
    const conflict = await rejectsWith(store.append(stream, [event('C')], 1), WrongExpectedVersion);
    assert.equal([conflict.expected, conflict.actual], [1, 2]);
    assert.equal((await store.readStream(stream)).events.map((e) => e.type), ['A', 'B']);
  });

  it('values the log cannot keep fail their own append, before it is sent; the appends beside them land', async ({ store }) => {
    const ordinary = Array.from({ length: 4 }, () => uniqueStream());
    const settled = await Promise.allSettled([
      store.append(ordinary[0], [event()], 'no_stream'),
      store.append(`bad-\u0000-${uniqueStream()}`, [event()], 'any'),
      store.append(ordinary[1], [event()], 'no_stream'),
      store.append(uniqueStream(), [event('T\ud800')], 'any'),
      store.append(ordinary[2], [event()], 'no_stream'),
      store.append(uniqueStream(), [event('T', { n: 1n })], 'no_stream'),
      store.append(ordinary[3], [event()], 'no_stream'),
    ]);
    assert.equal(settled.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled', 'rejected', 'fulfilled', 'rejected', 'fulfilled']);
    const reasons = settled.filter((r) => r.status === 'rejected').map((r) => (r as PromiseRejectedResult).reason);
    assert.instance(reasons[0], InvalidEvent);
    assert.is((reasons[0] as InvalidEvent).field, 'stream_id');
    assert.instance(reasons[1], InvalidEvent);
    assert.is((reasons[1] as InvalidEvent).field, 'event_type');
    assert.instance(reasons[2], TypeError);
    for (const s of ordinary) assert.is((await store.readStream(s)).version, 1);
  });

  it('strings JSON keeps but a database may not (U+0000, lone surrogates, the escape character, in values and keys) read back byte for byte: readStream, readAll, subscriptions', async ({ store }) => {
    const start = await settledHead(store);
    const strings = ['x\u0000y', '\u0000', '\ud800', 'a\udc00b', '\udbff\u0000\udfff', '\uE000', '\uE0000000', '\uE000escaped', '\\u0000', '😀 שלום \u202e end', '\u0001\u001f'];
    const sent = [
      event('Hostile', { user: 'x\u0000y', nested: { '\u0000key': ['\ud800', { '\uE000': '\udfff', deeper: strings }], ok: 1.5, nothing: null } }, { request_id: 'r-\u0000', '\ud83d': 'lone high as a key', ['__proto__']: 'x\u0000' }),
      event('Hostile', { plain: 'the mark as a key' }, { '\uE000escaped': 1, other: '\uE000' }),
      event('Hostile', ['\u0000', { '': '\ud800' }], {}),
      event('Plain', { emoji: '😀' }),
    ];
    const streams = sent.map(() => uniqueStream('hostile'));
    await Promise.all(sent.map((e, i) => store.append(streams[i], [e], 'no_stream')));
    const expected = new Map(sent.map((e) => [e.id, { data: e.data, metadata: e.metadata ?? {} }]));
    const same = (read: RecordedEvent[], how: string, count = expected.size) => {
      const found = read.filter((e) => expected.has(e.id));
      assert.is(found.length, count, `${how}: every event read`);
      for (const e of found) assert.equal({ data: e.data, metadata: e.metadata }, expected.get(e.id), `${how}: ${e.id} byte for byte`);
    };
    same((await Promise.all(streams.map((s) => store.readStream(s)))).flatMap((r) => r.events), 'readStream');
    same(await readEverythingAfter(store, start), 'readAll');
    const handed: RecordedEvent[] = [];
    const subscription = store.subscribe({ after: start, handle: async (events) => void handed.push(...events) });
    await within(waitLimitMs, subscription.caughtUp(), 'the subscription catching up');
    await subscription.stop();
    same(handed, 'a subscription');
    const typed: RecordedEvent[] = [];
    const typedSubscription = store.subscribe({ after: start, eventTypes: ['Hostile'], handle: async (events) => void typed.push(...events) });
    await within(waitLimitMs, typedSubscription.caughtUp(), 'the typed subscription catching up');
    await typedSubscription.stop();
    assert.ok(typed.every((e) => e.type === 'Hostile'));
    same(typed, 'a typed subscription', 3);
  });

  it('a subscriber with eventTypes is handed only those, and is caught up when the log ends with other types', async ({ store }) => {
    const start = await settledHead(store);
    const stream = uniqueStream();
    await store.append(stream, [event('Wanted', { n: 1 }), event('Other'), event('Wanted', { n: 2 }), event('Other'), event('Other')], 'no_stream');
    const handed: RecordedEvent[] = [];
    const subscription = store.subscribe({ after: start, eventTypes: ['Wanted'], pollIntervalMs: 60_000, handle: async (events) => void handed.push(...events) });
    try {
      await within(waitLimitMs, subscription.caughtUp(), 'caught up although the last events are of another type');
      assert.equal(handed.filter((e) => e.streamId === stream).map((e) => [e.type, e.data]), [['Wanted', { n: 1 }], ['Wanted', { n: 2 }]]);
      assert.ok(handed.every((e) => e.type === 'Wanted'));
      // live: a wanted event after others is handed over, the others are not
      await store.append(stream, [event('Other'), event('Wanted', { n: 3 })], 5);
      await within(waitLimitMs, subscription.caughtUp(), 'caught up with a live commit');
      assert.equal(handed.filter((e) => e.streamId === stream).map((e) => e.data), [{ n: 1 }, { n: 2 }, { n: 3 }]);
    } finally {
      await subscription.stop();
    }
  });

  for (const filter of ['eventTypes', 'skipMetadata'] as const) {
    it(`a subscriber with ${filter} goes through pages it passes over whole without pausing as if caught up, and is handed the rest in order`, async ({ store }) => {
      const start = await settledHead(store);
      const stream = uniqueStream();
      // With eventTypes the others are of type Other; with skipMetadata they are marked as this reader's own.
      const other = (n: number) => (filter === 'eventTypes' ? event('Other', { n }) : event('Wanted', { n }, { origin: 'me' }));
      const wanted = (n: number) => event('Wanted', { n }, { origin: 'them' });
      await store.append(stream, [other(1), other(2), other(3), other(4), other(5), wanted(6), other(7), wanted(8), other(9)], 'no_stream');
      const handed: RecordedEvent[] = [];
      const options = filter === 'eventTypes' ? { eventTypes: ['Wanted'] } : { skipMetadata: { key: 'origin', value: 'me' } };
      // Pages of 2, and a pause of a minute after a page that is not full: a page read as short because
      // its passed-over events did not come back would stall the reader here.
      const subscription = store.subscribe({ after: start, batchSize: 2, gatherMs: 60_000, pollIntervalMs: 60_000, ...options, handle: async (events) => void handed.push(...events) });
      try {
        await within(waitLimitMs, subscription.caughtUp(), 'caught up through pages passed over whole');
        assert.equal(handed.filter((e) => e.streamId === stream).map((e) => [e.data, e.streamVersion, e.metadata.origin]), [[{ n: 6 }, 6, 'them'], [{ n: 8 }, 8, 'them']]);
        assert.is(store.comparePositions(subscription.position, (await store.readAll(start, 20)).at(-1)!.globalPosition), 0, 'the position moved past the last, passed-over event');
      } finally {
        await subscription.stop();
      }
    });
  }

  it('a batch whose handler fails is told to onError and handed over again, then the subscriber goes on', async ({ store }) => {
    const start = await settledHead(store);
    const stream = uniqueStream();
    await store.append(stream, [event('First')], 'no_stream');
    const errors: unknown[] = [];
    const seen: string[][] = [];
    let failures = 2;
    const subscription = store.subscribe({
      after: start,
      pollIntervalMs: 20, // the pause before a retry
      onError: (error) => errors.push(error),
      async handle(events) {
        seen.push(events.filter((e) => e.streamId === stream).map((e) => e.type));
        if (failures-- > 0) throw new Error('handler down');
      },
    });
    try {
      await within(waitLimitMs, subscription.caughtUp(), 'the subscriber catching up after two failures');
      assert.equal(seen, [['First'], ['First'], ['First']]);
      assert.equal(errors.map((e) => (e as Error).message), ['handler down', 'handler down']);
      await store.append(stream, [event('Second')], 1);
      await within(waitLimitMs, subscription.caughtUp(), 'the next event');
      assert.equal(seen.at(-1), ['Second']);
    } finally {
      await subscription.stop();
    }
  });

  it('onCommit listeners hear of this process\'s appends at once, and of another instance\'s', async ({ store }) => {
    let heard = deferred();
    const off = store.onCommit(() => heard.resolve());
    const other = target.instances ? await target.open() : null;
    try {
      await store.append(uniqueStream(), [event()], 'no_stream');
      await within(waitLimitMs, heard.promise, 'a listener told of our own append');
      if (other) {
        await sleep(50); // this process's own hint has come and gone
        heard = deferred();
        await other.append(uniqueStream(), [event()], 'no_stream');
        await within(waitLimitMs, heard.promise, "a listener told of another instance's append");
      }
    } finally {
      off();
      await other?.close();
    }
  });

  it.run();
}
