/** The event store contract: every adapter passes the same suite (PGlite always, Postgres with DATABASE_URL). */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import {
  DuplicateEventId,
  WrongExpectedVersion,
  comparePositions,
  logStart,
  type EventStore,
  type RecordedEvent,
} from '../../src/store/index.ts';
import pg from 'pg';
import { adaptersUnderTest, deferred, event, uniqueStream } from './adapters.ts';

async function rejectsWith<E extends Error>(promise: Promise<unknown>, type: new (...args: never[]) => E): Promise<E> {
  try {
    await promise;
  } catch (error) {
    assert.instance(error, type);
    return error as E;
  }
  return assert.unreachable(`expected a ${type.name}`) as never;
}

/** The head once everything committed so far is readable, so a test's "start" is not behind earlier tests' events. */
async function settledHead(store: EventStore) {
  await store.readable();
  return store.head();
}

async function readEverythingAfter(store: EventStore, after = logStart): Promise<RecordedEvent[]> {
  await store.readable();
  const all: RecordedEvent[] = [];
  for (let position = after; ; ) {
    const batch = await store.readAll(position, 100);
    if (batch.length === 0) return all;
    all.push(...batch);
    position = batch[batch.length - 1].globalPosition;
  }
}

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore }>(`event store contract (${adapter.name})`);

  it.before(async (context) => {
    context.store = await adapter.open();
  });

  it.after(async (context) => {
    await context.store?.close();
    await adapter.cleanup();
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
    assert.is(comparePositions(read.events[1].globalPosition, result.lastPosition), 0);
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

  it('event ids reused at another place are a typed error, not a silent success', async ({ store }) => {
    const stream = uniqueStream();
    const used = event('A');
    await store.append(stream, [used], 'no_stream');
    await rejectsWith(store.append(stream, [used], 1), DuplicateEventId);
    await rejectsWith(store.append(uniqueStream(), [used], 'any'), DuplicateEventId);
    await rejectsWith(store.append(stream, [event('B'), used], 1), DuplicateEventId);
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
    await store.readable(); // other transactions on the server may still hide our commits for a moment
    const firstPage = await store.readAll(start, 2);
    assert.equal(firstPage.map((e) => e.type), ['A1', 'A2']);
    const rest = await store.readAll(firstPage[1].globalPosition, 10);
    assert.equal(rest.map((e) => e.type), ['B1', 'A3']);
    const head = await store.head();
    assert.equal(head, rest[1].globalPosition);
    assert.is(await store.countAfter(start), 4);
    assert.is(await store.countAfter(head), 0);
  });

  it('group commit: many concurrent appends all land, each once, and a conflict fails only its own append', async ({ store }) => {
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

  it('group commit: concurrent appends to one stream keep their call order', async ({ store }) => {
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
    if (adapter.name === 'postgres') {
      // two processes' worth of connections, racing on the database's row lock rather than in one queue
      const other = await adapter.open();
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
    const other = adapter.name === 'postgres' ? await adapter.open() : store;
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

  it('a rolled-back append leaves nothing visible', async ({ store }) => {
    const start = await settledHead(store);
    const stream = uniqueStream();
    const failure = new Error('abandoned');
    try {
      await store.transaction(async (tx) => {
        await tx.append(stream, [event('Lost'), event('Lost')], 'no_stream');
        throw failure;
      });
      assert.unreachable('the transaction should fail');
    } catch (error) {
      assert.is(error, failure);
    }
    assert.equal(await store.readStream(stream), { version: 0, events: [] });
    assert.equal(await store.readAll(start, 10), []);
    // the stream is still new: the next append starts it at version 1
    await store.append(stream, [event('Kept')], 'no_stream');
    await store.readable();
    const after = await store.readAll(start, 10);
    assert.equal(after.map((e) => [e.type, e.streamVersion]), [['Kept', 1]]);
  });

  it('an append inside a transaction commits with the transaction', async ({ store }) => {
    const stream = uniqueStream();
    const result = await store.transaction(async (tx) => {
      const appended = await tx.append(stream, [event('T')], 'no_stream');
      await rejectsWith(tx.append(uniqueStream(), [event()], 5), WrongExpectedVersion);
      return appended;
    });
    assert.is(result.nextExpectedVersion, 1);
    assert.is((await store.readStream(stream)).version, 1);
  });

  it('a slow early transaction that commits after a later one is not skipped by a reader of the global log', async ({ store }) => {
    const start = await settledHead(store);
    const early = uniqueStream();
    const late = uniqueStream();
    const appended = deferred();
    const release = deferred();
    const slow = store.transaction(async (tx) => {
      await tx.append(early, [event('Early')], 'no_stream');
      appended.resolve();
      await release.promise;
    });
    await appended.promise;

    // A reader that keeps a checkpoint and never reads past what it has seen.
    const seen: RecordedEvent[] = [];
    let checkpoint = start;
    const readOnce = async () => {
      const batch = await store.readAll(checkpoint, 100);
      seen.push(...batch);
      if (batch.length > 0) checkpoint = batch[batch.length - 1].globalPosition;
    };

    if (store.adapter === 'postgres') {
      // The later transaction commits first; its event sits above the early one's in global_position.
      await store.append(late, [event('Late')], 'no_stream');
      await readOnce();
      assert.equal(seen.map((e) => e.type), [], 'nothing is readable while an older transaction runs');
      release.resolve();
      await slow;
    } else {
      // PGlite runs one transaction at a time: the later append and the read queue behind the slow one.
      const lateAppend = store.append(late, [event('Late')], 'no_stream');
      const read = readOnce();
      release.resolve();
      await Promise.all([slow, lateAppend, read]);
    }
    await store.readable();
    await readOnce();
    assert.equal(seen.map((e) => e.type), ['Early', 'Late']);
    assert.ok(comparePositions(seen[0].globalPosition, seen[1].globalPosition) < 0);
  });

  if (adapter.name === 'postgres') {
    it('a commit waits behind any older open transaction on the server, then becomes readable', async ({ store }) => {
      const start = await settledHead(store);
      const other = new pg.Client({ connectionString: process.env.DATABASE_URL });
      await other.connect();
      try {
        await other.query('BEGIN');
        await other.query('SELECT pg_current_xact_id()'); // takes a transaction id, as any writer would
        const stream = uniqueStream();
        await store.append(stream, [event('Hidden')], 'no_stream');
        assert.equal(await store.readAll(start, 10), [], 'not readable while the older transaction runs');
        let readable = false;
        const waiting = store.readable().then(() => (readable = true));
        await store.ping(); // a round trip: readable() has had its chance to resolve wrongly
        assert.is(readable, false);
        await other.query('COMMIT');
        await waiting;
        assert.equal((await store.readAll(start, 10)).map((e) => e.type), ['Hidden']);
      } finally {
        await other.end();
      }
    });
  }

  it('a live subscription catches up, then is woken within 50 ms of a commit', async ({ store }) => {
    const start = await settledHead(store);
    const stream = uniqueStream();
    await store.append(stream, [event('Before')], 'no_stream');
    // A second store instance is another process as far as Postgres knows: it is woken by NOTIFY.
    const reader = store.adapter === 'postgres' ? await adapter.open() : store;
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
      await subscription.caughtUp();
      assert.equal(received, ['Before']);
      const latencies: number[] = [];
      for (let i = 0; i < 5; i++) {
        woken = deferred<number>();
        const committedAt = performance.now();
        await store.append(stream, [event('Live')], i + 1);
        latencies.push((await woken.promise) - committedAt);
      }
      await subscription.stop();
      assert.is(received.length, 6);
      // The median, so one scheduling hiccup on a loaded 2-core machine does not decide the verdict;
      // every wake-up still came from the hint, the polling fallback being a minute away.
      const median = [...latencies].sort((x, y) => x - y)[2];
      assert.ok(median < 50, `woken after ${latencies.map((l) => l.toFixed(1)).join(', ')} ms`);
    } finally {
      if (reader !== store) await reader.close();
    }
  });

  it('ping answers with latency', async ({ store }) => {
    const result = await store.ping(2000);
    assert.is(result.ok, true);
    assert.type(result.latencyMs, 'number');
  });

  it.run();
}
