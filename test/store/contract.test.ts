/**
 * The event store contract of the SQL adapters (PGlite always, Postgres with DATABASE_URL): the log
 * port's contract, which every log passes (log-contract.ts), then what the SQL adapters add
 * (transactions, SQL, the connection, the one table).
 *
 * PGlite runs one transaction at a time, so on PGlite no concurrency mutation can be caught: the race,
 * interleaving, deadlock and isolation tests check only their single-transaction outcome there, and
 * the PostgreSQL run (CI sets DATABASE_URL; see docs/development.md, "Tests") is the one that
 * can fail them.
 */
import { suite } from 'uvu';
import { randomUUID } from 'node:crypto';
import * as assert from 'uvu/assert';
import {
  AppendNotFirstWrite,
  DuplicateEventId,
  InvalidEvent,
  StoreCallInsideTransaction,
  StoreUnavailable,
  TransactionRolledBack,
  WrongExpectedVersion,
  comparePositions,
  logStart,
  type EventStore,
  type RecordedEvent,
} from '../../src/store/index.ts';
import pg from 'pg';
import { randomBytes } from 'node:crypto';
import { adaptersUnderTest, deferred, event, uniqueStream } from './adapters.ts';
import { logContract, readEverythingAfter, rejectsWith, settledHead, sleep, waitLimitMs } from './log-contract.ts';
import { startTcpProxy } from '../support/tcp-proxy.ts';
import { within } from '../support/within.ts';

for (const adapter of adaptersUnderTest()) {
  // The log port first, on a store of its own (the same schema on Postgres; this suite's after() drops it).
  logContract({ name: adapter.name, open: () => adapter.open(), instances: adapter.name === 'postgres', uniqueEventIds: true });

  // `releases`: transactions a test holds open, ended in after() whatever happened, so a failing
  // test cannot leave the store's close (and the file) waiting for them.
  const it = suite<{ store: EventStore; releases: (() => void)[] }>(`event store contract (${adapter.name})`);

  it.before(async (context) => {
    context.releases = [];
    context.store = await adapter.open();
  });

  it.after(async (context) => {
    for (const release of context.releases ?? []) release();
    await context.store?.close();
    await adapter.cleanup();
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
    await within(waitLimitMs, store.readable(), 'the kept append readable');
    const after = await store.readAll(start, 10);
    assert.equal(after.map((e) => [e.type, e.streamVersion]), [['Kept', 1]]);
  });

  it('a transaction whose failed statement the callback swallowed rejects with TransactionRolledBack, and its acknowledged append is not stored', async ({ store }) => {
    const start = await settledHead(store);
    const stream = uniqueStream();
    let acknowledged = false;
    const refused = await rejectsWith(
      store.transaction(async (tx) => {
        acknowledged = (await tx.append(stream, [event('Acknowledged')], 'no_stream')).nextExpectedVersion === 1;
        await tx.query('SELECT 1/0').catch(() => {}); // fails, and the callback goes on as if it had not
        return 'looked fine';
      }),
      TransactionRolledBack,
    );
    assert.ok(acknowledged, 'the append inside was acknowledged');
    assert.match(refused.message, /rolled back instead of committed/);
    assert.equal(await store.readStream(stream), { version: 0, events: [] });
    assert.equal((await readEverythingAfter(store, start)).filter((e) => e.streamId === stream), []);
    // the connection is clean again: the next transaction on it commits
    await store.transaction((tx) => tx.append(stream, [event('Kept')], 'no_stream'));
    assert.equal((await store.readStream(stream)).events.map((e) => [e.type, e.streamVersion]), [['Kept', 1]]);
  });

  it('a batch of statements runs in order in one call, its values arriving exactly as parameters would', async ({ store }) => {
    const table = `batch_${randomUUID().replaceAll('-', '')}`;
    await store.query(`CREATE TABLE ${table} (k int PRIMARY KEY, t text, n bigint, f float8, j jsonb, at timestamptz)`);
    const nasty = `it's a \\ back'slash; DROP TABLE ${table}; -- "quoted" ' $1 \n line`;
    // Dollar-quoted when it holds no `$`: backslashes, quotes and `$$`-like tails stay as they are.
    const plain = `it's a \\ back'slash, "quoted" \n line, ending in a quote'`;
    await store.transaction((tx) =>
      tx.queryBatch([
        { sql: `INSERT INTO ${table} (k, t, n, f, j, at) VALUES ($1, $2, $3::bigint, $4::float8, $5::jsonb, $6::timestamptz)`, params: [1, nasty, 9007199254740991, 0.30000000000000004, JSON.stringify({ q: "o'k" }), new Date('2026-11-24T01:02:03.456Z')] },
        { sql: `INSERT INTO ${table} (k, t) VALUES ($1, $2)`, params: [2, null] },
        { sql: `INSERT INTO ${table} (k, t, j) VALUES ($1, $2, $3::jsonb)`, params: [4, plain, JSON.stringify({ s: plain, d: 'a $$ b $ c$' })] },
        { sql: `UPDATE ${table} SET n = n + $2::bigint WHERE k = $1`, params: [1, -1] },
      ]),
    );
    // A large value that several statements cast is sent once and read by each (see sql-script.ts);
    // one that a statement leaves uncast is inlined in each.
    const large = JSON.stringify(Array.from({ length: 200 }, (_, i) => ({ k: 10 + i, t: `row ${i}: it's a \\ "quoted" line` })));
    const largeUncast = `${'x'.repeat(2000)} it's`;
    await store.transaction((tx) =>
      tx.queryBatch([
        { sql: `INSERT INTO ${table} (k, t) SELECT k, t FROM jsonb_to_recordset($1::jsonb) AS e(k int, t text) WHERE k < 110`, params: [large] },
        { sql: `INSERT INTO ${table} (k, t) SELECT k, t FROM jsonb_to_recordset($2::jsonb) AS e(k int, t text) WHERE k >= $1`, params: [110, large] },
        { sql: `INSERT INTO ${table} (k, t) VALUES ($1, $2)`, params: [300, largeUncast] },
        { sql: `UPDATE ${table} SET t = t || $1 WHERE k = $2`, params: [largeUncast, 300] },
      ]),
    );
    const { rows: shared } = await store.query<{ k: number; t: string }>(`SELECT k, t FROM ${table} WHERE k >= 10 ORDER BY k`);
    assert.equal(shared.slice(0, 200), JSON.parse(large));
    assert.equal(shared[200], { k: 300, t: largeUncast + largeUncast });
    await store.query(`DELETE FROM ${table} WHERE k >= 10`);
    const { rows } = await store.query<{ k: number; t: string | null; n: string | null; f: number | null; j: unknown; at: Date | null }>(`SELECT * FROM ${table} ORDER BY k`);
    assert.is(rows[0].t, nasty);
    assert.is(Number(rows[0].n), 9007199254740990);
    assert.is(rows[0].f, 0.30000000000000004);
    assert.equal(rows[0].j, { q: "o'k" });
    assert.is(new Date(rows[0].at!).toISOString(), '2026-11-24T01:02:03.456Z');
    assert.equal([rows[1].k, rows[1].t], [2, null]);
    assert.equal([rows[2].k, rows[2].t, rows[2].j], [4, plain, { s: plain, d: 'a $$ b $ c$' }]);
    // A failing statement fails the batch and the transaction: nothing of it stays.
    try {
      await store.transaction((tx) => tx.queryBatch([{ sql: `INSERT INTO ${table} (k) VALUES ($1)`, params: [3] }, { sql: `INSERT INTO ${table} (k) VALUES ($1)`, params: [1] }]));
      assert.unreachable('a duplicate key passed');
    } catch (error) {
      assert.match(String(error), /duplicate key|unique/i);
    }
    assert.is((await store.query(`SELECT k FROM ${table} WHERE k = 3`)).rows.length, 0);
    await store.query(`DROP TABLE ${table}`);
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

  it('a slow early transaction that commits after a later one is not skipped by a reader of the global log', async ({ store, releases }) => {
    const start = await settledHead(store);
    const early = uniqueStream();
    const late = uniqueStream();
    const appended = deferred();
    const release = deferred();
    releases.push(() => release.resolve());
    const slow = store.transaction(async (tx) => {
      await tx.append(early, [event('Early')], 'no_stream');
      appended.resolve();
      await release.promise;
    });
    await within(waitLimitMs, appended.promise, 'the slow transaction appending');

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
      await within(waitLimitMs, slow, 'the slow transaction committing');
    } else {
      // PGlite runs one transaction at a time: the later append and the read queue behind the slow one.
      const lateAppend = store.append(late, [event('Late')], 'no_stream');
      const read = readOnce();
      release.resolve();
      await within(waitLimitMs, Promise.all([slow, lateAppend, read]), 'the slow transaction, the later append and the read');
    }
    await within(waitLimitMs, store.readable(), 'both commits readable');
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
        await within(waitLimitMs, waiting, 'readable() once the older transaction committed');
        assert.equal((await store.readAll(start, 10)).map((e) => e.type), ['Hidden']);
      } finally {
        await other.end();
      }
    });
  }

  it('concurrent appends of one event id to two streams: the first keeps it, the second gets DuplicateEventId', async ({ store }) => {
    for (const expected of ['no_stream', 'any'] as const) {
      const shared = event('Shared');
      const s1 = uniqueStream();
      const s2 = uniqueStream();
      const [first, second] = await Promise.allSettled([store.append(s1, [shared], 'no_stream'), store.append(s2, [shared], expected)]);
      assert.is(first.status, 'fulfilled', String((first as PromiseRejectedResult).reason));
      assert.instance((second as PromiseRejectedResult).reason, DuplicateEventId);
      const kept = await store.readStream(s1);
      assert.equal(kept.events.map((e) => [e.id, e.streamVersion]), [[shared.id, 1]]);
      assert.equal(await store.readStream(s2), { version: 0, events: [] });
    }
    // the same inside one transaction: the second append's undo must not remove the first's event
    const shared = event('Shared');
    const s1 = uniqueStream();
    const s2 = uniqueStream();
    await store.transaction(async (tx) => {
      await tx.append(s1, [shared], 'no_stream');
      await rejectsWith(tx.append(s2, [shared], 'any'), DuplicateEventId);
    });
    assert.equal((await store.readStream(s1)).events.map((e) => e.id), [shared.id]);
    assert.is((await store.readStream(s2)).version, 0);
  });

  it('the append function itself refuses a batch that names one stream twice', async ({ store }) => {
    const stream = uniqueStream();
    try {
      await store.query(
        `SELECT * FROM svc_append_batch(ARRAY[$1, $1], ARRAY[-1, -1]::bigint[], ARRAY[1, 1], ARRAY[1, 2], ARRAY[1, 1],
           ARRAY[gen_random_uuid(), gen_random_uuid()], ARRAY['T', 'T'], '[{}, {}]'::jsonb, '[{}, {}]'::jsonb)`,
        [stream],
      );
      assert.unreachable('the batch should be refused');
    } catch (error) {
      assert.match((error as Error).message, /names a stream more than once/);
    }
    assert.is((await store.readStream(stream)).version, 0);
  });

  it('a woken subscriber whose commit an older transaction hides gets it within 100 ms of that transaction ending (poll 60 s)', async ({ store, releases }) => {
    // A second store instance is another process as far as Postgres knows.
    const reader = store.adapter === 'postgres' ? await adapter.open() : store;
    const side = store.adapter === 'postgres' ? new pg.Client({ connectionString: process.env.DATABASE_URL }) : null;
    await side?.connect();
    try {
      const stream = uniqueStream();
      await store.append(stream, [event('Before')], 'no_stream');
      let delivered = deferred<number>();
      const subscription = reader.subscribe({
        after: await settledHead(store),
        pollIntervalMs: 60_000, // the polling fallback cannot be what delivers it
        async handle(events) {
          if (events.some((e) => e.type === 'Live')) delivered.resolve(performance.now());
        },
      });
      await within(waitLimitMs, subscription.caughtUp(), 'the subscriber catching up');
      const latencies: number[] = [];
      for (let round = 0; round < 3; round++) {
        delivered = deferred<number>();
        let endSide: () => Promise<unknown>;
        if (side) {
          await side.query('BEGIN');
          await side.query('SELECT pg_current_xact_id()'); // holds the visibility horizon, as any writer would
          await store.append(stream, [event('Live')], round + 1);
          // let the woken subscriber read, find nothing readable and go back to waiting
          await sleep(300);
          endSide = () => side.query('COMMIT');
        } else {
          // PGlite: one transaction at a time; the append queues behind the side transaction.
          const release = deferred();
          releases.push(() => release.resolve());
          const held = deferred();
          const sideTx = store.transaction(async (tx) => {
            await tx.query('SELECT pg_current_xact_id()');
            held.resolve();
            await release.promise;
          });
          await within(waitLimitMs, held.promise, 'the side transaction starting');
          const appending = store.append(stream, [event('Live')], round + 1);
          endSide = async () => {
            release.resolve();
            await Promise.all([sideTx, appending]);
          };
        }
        const ended = performance.now();
        await within(waitLimitMs, endSide(), 'the side transaction ending');
        latencies.push((await within(3000, delivered.promise, `round ${round + 1}: delivery after the older transaction ended`)) - ended);
      }
      await subscription.stop();
      // the best of three: each proves the wake-up mechanism, one slow scheduling round on a busy machine does not disprove it
      assert.ok(Math.min(...latencies) < 100, `delivered ${latencies.map((l) => l.toFixed(1)).join(', ')} ms after the older transaction ended`);
    } finally {
      await side?.end();
      if (reader !== store) await reader.close();
    }
  });

  it('versions follow the global order: an append must be the first write of its transaction (three connections)', async ({ store }) => {
    const stream = uniqueStream();
    await store.append(stream, [event('V1')], 'no_stream');
    // Connection 1: a transaction that wrote (took its transaction id) before appending.
    const other = store.adapter === 'postgres' ? await adapter.open() : null;
    try {
      // The refusal is an error of the transaction's statement: the transaction rolls back.
      const refused = await rejectsWith(
        store.transaction(async (tx) => {
          await tx.query('SELECT pg_current_xact_id()');
          // Connection 2: another process appends the next version meanwhile (it commits with a newer id).
          if (other) await other.append(stream, [event('V2')], 'any');
          await tx.append(stream, [event('Late')], 'any');
        }),
        AppendNotFirstWrite,
      );
      assert.is(refused.reason, 'wrote_first');
      // A later append of a transaction whose first append came before another process's write.
      const second = uniqueStream();
      if (other) {
        const newer = await rejectsWith(
          store.transaction(async (tx) => {
            await tx.append(second, [event('First')], 'no_stream');
            await other.append(stream, [event('V3')], 'any');
            await tx.append(stream, [event('Late')], 'any');
          }),
          AppendNotFirstWrite,
        );
        assert.is(newer.reason, 'newer_writer');
      }
      await store.transaction(async (tx) => {
        await tx.append(second, [event('First')], 'no_stream');
        await tx.append(stream, [event('Next')], 'any'); // only its own appends before it: allowed
      });
      // Connection 3: the global log holds the stream's versions in order.
      const all = (await readEverythingAfter(store)).filter((e) => e.streamId === stream);
      assert.equal(all.map((e) => e.streamVersion), all.map((_, i) => i + 1));
      assert.is(all.length, other ? 4 : 2);
    } finally {
      await other?.close();
    }
  });

  // PostgreSQL only: PGlite runs one transaction at a time, there is no interleaving to read (see the top of the file).
  if (adapter.name === 'postgres') it('a late-committing transaction is read after, not skipped, when positions interleave between transactions', async ({ store, releases }) => {
    const start = await settledHead(store);
    const [a, b, c] = [uniqueStream(), uniqueStream(), uniqueStream()];
    const firstDone = deferred();
    const lateAppended = deferred();
    const earlyCommitted = deferred();
    releases.push(() => earlyCommitted.resolve());
    // Early: takes its transaction id first, but writes its second event after Late has written.
    const early = store.transaction(async (tx) => {
      await tx.append(a, [event('EarlyA')], 'no_stream');
      firstDone.resolve();
      await lateAppended.promise;
      await tx.append(c, [event('EarlyC')], 'no_stream');
    });
    await within(waitLimitMs, firstDone.promise, "Early's first append");
    // Late: a newer transaction id, a position between Early's two, commits last.
    const late = store.transaction(async (tx) => {
      await tx.append(b, [event('LateB')], 'no_stream');
      lateAppended.resolve();
      await earlyCommitted.promise;
    });
    await within(waitLimitMs, early, 'Early committing');
    const seen: RecordedEvent[] = [];
    let checkpoint = start;
    const readOnce = async () => {
      const batch = await store.readAll(checkpoint, 100);
      seen.push(...batch);
      if (batch.length > 0) checkpoint = batch[batch.length - 1].globalPosition;
    };
    await readOnce();
    earlyCommitted.resolve();
    await within(waitLimitMs, late, 'Late committing');
    await within(waitLimitMs, store.readable(), 'both transactions readable');
    await readOnce();
    assert.equal(seen.filter((e) => [a, b, c].includes(e.streamId)).map((e) => e.type), ['EarlyA', 'EarlyC', 'LateB']);
  });

  it('two processes appending to the same streams in opposite order never deadlock', async ({ store }) => {
    const deadlocks: unknown[] = [];
    const onBatchError = (error: unknown) => {
      if ((error as { code?: string }).code === '40P01') deadlocks.push(error);
    };
    const one = await adapter.open({ onBatchError });
    const two = store.adapter === 'postgres' ? await adapter.open({ onBatchError }) : one;
    try {
      // batches large enough that two of them insert at the same time (the original code deadlocked in 3 of 30 rounds)
      const streams = Array.from({ length: 200 }, () => uniqueStream());
      const rounds = 30;
      for (let round = 0; round < rounds; round++) {
        await Promise.all([
          ...streams.map((s) => one.append(s, [event('Forward')], 'any')),
          ...[...streams].reverse().map((s) => two.append(s, [event('Backward')], 'any')),
        ]);
      }
      assert.is(deadlocks.length, 0, `${deadlocks.length} deadlocks in ${rounds} rounds`);
      for (const s of streams) assert.is((await one.readStream(s)).version, rounds * 2);
    } finally {
      if (two !== one) await two.close();
      await one.close();
    }
  });

  it("the store's transactions run at READ COMMITTED whatever the database's default", async ({ store }) => {
    const isolation = (s: EventStore) => s.transaction(async (tx) => (await tx.query<{ i: string }>('SELECT current_setting($1) AS i', ['transaction_isolation'])).rows[0].i);
    if (store.adapter === 'pglite') {
      const own = await adapter.open();
      try {
        await own.query(`SET default_transaction_isolation TO 'repeatable read'`);
        assert.is(await isolation(own), 'read committed');
      } finally {
        await own.close();
      }
      return;
    }
    const role = `svc_rr_${randomBytes(4).toString('hex')}`;
    const admin = new pg.Client({ connectionString: process.env.DATABASE_URL });
    await admin.connect();
    await admin.query(`CREATE ROLE ${role} LOGIN SUPERUSER`);
    await admin.query(`ALTER ROLE ${role} SET default_transaction_isolation = 'repeatable read'`);
    const url = new URL(process.env.DATABASE_URL!);
    url.username = role;
    const stores: EventStore[] = [];
    try {
      stores.push(await adapter.open({ databaseUrl: url.href }), await adapter.open({ databaseUrl: url.href }));
      assert.is(await isolation(stores[0]), 'read committed');
      // writers racing from two pools, with every expected-version kind: no raw serialization failure
      const stream = uniqueStream();
      await stores[0].append(stream, [event()], 'no_stream');
      const results = await Promise.allSettled(
        Array.from({ length: 40 }, (_, i) => stores[i % 2].append(stream, [event('A', { i })], i % 4 < 2 ? 'any' : 'stream_exists')),
      );
      assert.equal(results.filter((r) => r.status === 'rejected').map((r) => String((r as PromiseRejectedResult).reason)), []);
      assert.is((await store.readStream(stream)).version, 41);
      const racing = uniqueStream();
      const exact = await Promise.allSettled([stores[0].append(racing, [event()], 'no_stream'), stores[1].append(racing, [event()], 'no_stream')]);
      assert.equal(exact.map((r) => r.status).sort(), ['fulfilled', 'rejected']);
      assert.instance((exact.find((r) => r.status === 'rejected') as PromiseRejectedResult).reason, WrongExpectedVersion);
    } finally {
      for (const s of stores) await s.close();
      await admin.query(`DROP ROLE ${role}`).catch(() => {});
      await admin.end();
    }
  });

  it('store calls inside store.transaction are refused the same way on both adapters', async ({ store }) => {
    const stream = uniqueStream();
    await within(
      waitLimitMs * 2,
      store.transaction(async (tx) => {
        await rejectsWith(store.query('SELECT 1'), StoreCallInsideTransaction);
        await rejectsWith(store.append(stream, [event()], 'no_stream'), StoreCallInsideTransaction);
        await rejectsWith(store.readStream(stream), StoreCallInsideTransaction);
        await rejectsWith(store.readAll(logStart, 1), StoreCallInsideTransaction);
        await rejectsWith(store.transaction(async () => {}), StoreCallInsideTransaction);
        await tx.append(stream, [event('Inside')], 'no_stream'); // the transaction's own calls work
        assert.is((await tx.readAll(logStart, 1)).length, 1);
      }),
      'a store call inside a transaction',
    );
    assert.is((await store.readStream(stream)).version, 1);
  });

  // PostgreSQL only: on PGlite such a call would wait for the transaction forever.
  if (adapter.name === 'postgres') it('with nestedCallCheck off (svc serve) the callback is not tracked: a store call inside it runs on its own connection', async () => {
    const untracked = await adapter.open({ nestedCallCheck: false });
    try {
      const stream = uniqueStream();
      await within(
        waitLimitMs * 2,
        untracked.transaction(async (tx) => {
          await tx.append(stream, [event('Inside')], 'no_stream');
          assert.equal((await untracked.query<{ one: number }>('SELECT 1 AS one')).rows, [{ one: 1 }]);
          assert.is((await untracked.readStream(stream)).version, 0, 'another connection does not see the open transaction');
        }),
        'an untracked store call inside a transaction',
      );
      assert.is((await untracked.readStream(stream)).version, 1);
    } finally {
      await untracked.close();
    }
  });

  // PostgreSQL only (this and the next): PGlite runs in this process, there is no connection to lose.
  if (adapter.name === 'postgres') it('a black-holed connection fails appends fast with StoreUnavailable; the store then recovers by itself', async ({ store }) => {
    const proxy = await startTcpProxy(process.env.DATABASE_URL!);
    const timeouts = { connectTimeoutMs: 500, statementTimeoutMs: 500, keepAliveMs: 1000 };
    const through = await adapter.open({ databaseUrl: proxy.url, ...timeouts });
    try {
      const streams = [uniqueStream(), uniqueStream(), uniqueStream()];
      for (const s of streams) await through.append(s, [event('Before')], 'no_stream');
      proxy.blackHole();
      // more appends than connections for appends, and one stream twice: none may wait for ever
      const stuck = await within(
        20_000,
        Promise.allSettled([...streams, streams[0]].map((s) => through.append(s, [event('Lost')], 'any'))),
        'appends through a black-holed connection',
      );
      for (const result of stuck) {
        assert.is(result.status, 'rejected');
        assert.instance((result as PromiseRejectedResult).reason, StoreUnavailable);
      }
      const ping = await through.ping(5000);
      assert.is(ping.ok, false);
      proxy.heal();
      // recovers: fresh connections, the same streams append again, a reader is woken again
      const reader = through.subscribe({ after: await settledHead(store), pollIntervalMs: 60_000, handle: async () => {} });
      for (const s of streams) {
        const read = await store.readStream(s);
        const next = await within(20_000, through.append(s, [event('After')], read.version), 'an append after healing');
        assert.is(next.nextExpectedVersion, read.version + 1);
      }
      await within(20_000, reader.caughtUp(), 'a subscriber after healing');
      await reader.stop();
    } finally {
      await through.close();
      await proxy.close();
    }
  });

  if (adapter.name === 'postgres') it('an append whose connection is cut after its commit: StoreUnavailable (outcome unknown), and resending the same ids at the same expected version is an idempotent success', async ({ store }) => {
    const proxy = await startTcpProxy(process.env.DATABASE_URL!);
    const through = await adapter.open({ databaseUrl: proxy.url, statementTimeoutMs: 2000 });
    try {
      for (const expected of [1, 'any', 'stream_exists'] as const) {
        const stream = uniqueStream();
        await through.append(stream, [event('Opened')], 'no_stream');
        const events = [event('Charged'), event('Charged')];
        // svc_append: the prepared name of both append statements (a plain INSERT for a named version, else the function)
        const cutDone = proxy.cutAfterReplyTo('svc_append');
        const lost = await rejectsWith(through.append(stream, events, expected), StoreUnavailable);
        await cutDone;
        assert.is(lost.outcomeUnknown, true);
        assert.is((await store.readStream(stream)).version, 3, 'it did commit');
        const resent = await through.append(stream, events, expected);
        assert.equal([resent.idempotent, resent.nextExpectedVersion], [true, 3]);
        assert.equal((await store.readStream(stream)).events.map((e) => e.id), [(await store.readStream(stream)).events[0].id, events[0].id, events[1].id]);
      }
      // a first append (no_stream) too
      const fresh = uniqueStream();
      const opening = [event('Opened')];
      const cutDone = proxy.cutAfterReplyTo('svc_append');
      await rejectsWith(through.append(fresh, opening, 'no_stream'), StoreUnavailable);
      await cutDone;
      assert.is((await through.append(fresh, opening, 'no_stream')).idempotent, true);
      assert.is((await store.readStream(fresh)).version, 1);
    } finally {
      await through.close();
      await proxy.close();
    }
  });

  it('an event whose strings jsonb refuses (U+0000, lone surrogates, the escape character, in values and keys) shares a group commit with ordinary appends, none of which fails, and reads back byte for byte everywhere', async ({ store }) => {
    const batchErrors: unknown[] = [];
    const writer = await adapter.open({ onBatchError: (error) => batchErrors.push(error) });
    try {
      const start = await settledHead(writer);
      const strings = ['x\u0000y', '\u0000', '\ud800', 'a\udc00b', '\udbff\u0000\udfff', '\uE000', '\uE0000000', '\uE000escaped', '\\u0000', '\\\u0000', '\\ud800', '😀 שלום \u202e end', 'ünïcødé', '\u0001\u001f'];
      const hostileData = {
        user: 'x\u0000y',
        nested: { '\u0000key': ['\ud800', { '\uE000': '\udfff', deeper: strings }], ok: 1.5, nothing: null },
        ...Object.fromEntries(strings.map((text, i) => [`${text}#${i}`, text])),
      };
      const hostileMetadata = { request_id: 'r-\u0000', '\ud83d': 'lone high as a key', 'emoji 😀': '\uE000', nested: { s: strings }, ['__proto__']: 'x\u0000' };
      const hostile = [
        event('Hostile', hostileData, hostileMetadata),
        event('Hostile', { plain: 'no escaping needed, but the caller uses the mark as a key' }, { '\uE000escaped': 1, other: '\uE000' }),
        event('Hostile', ['\u0000', { '': '\ud800' }], {}),
        event('Plain', { esc: '\uE0000000 kept as sent in an unmarked event', emoji: '😀' }),
      ];
      const hostileStreams = hostile.map(() => uniqueStream('hostile'));
      const ordinaryStreams = Array.from({ length: 24 }, () => uniqueStream('ordinary'));
      // all queued in one turn: they leave together in one or two group-commit batches
      const appends = [
        ...ordinaryStreams.slice(0, 12).map((s, i) => writer.append(s, [event('Ordinary', { i })], 'no_stream')),
        ...hostile.map((e, i) => writer.append(hostileStreams[i], [e], 'no_stream')),
        ...ordinaryStreams.slice(12).map((s, i) => writer.append(s, [event('Ordinary', { i: i + 12 })], 'no_stream')),
      ];
      const results = await Promise.allSettled(appends);
      assert.equal(results.filter((r) => r.status === 'rejected'), [], 'no append fails');
      assert.equal(batchErrors, [], 'no batch failed (so none was retried append by append)');
      // and inside a transaction
      const txStream = uniqueStream('hostile');
      const txEvent = event('Hostile', { in: 'a transaction', s: strings }, { s: '\u0000' });
      await writer.transaction((tx) => tx.append(txStream, [txEvent], 'no_stream'));

      const expected = new Map([...hostile, txEvent].map((e) => [e.id, { data: e.data, metadata: e.metadata ?? {} }]));
      const same = (read: RecordedEvent[], how: string) => {
        const found = read.filter((e) => expected.has(e.id));
        assert.is(found.length, expected.size, `${how}: every event read`);
        for (const e of found) assert.equal({ data: e.data, metadata: e.metadata }, expected.get(e.id), `${how}: ${e.id} byte for byte`);
      };
      const streamReads = await Promise.all([...hostileStreams, txStream].map((s) => writer.readStream(s)));
      same(streamReads.flatMap((r) => r.events), 'readStream');
      same(await readEverythingAfter(writer, start), 'readAll');
      same(await writer.transaction((tx) => tx.readAll(start, 1000)), 'a transaction\'s readAll');
      const handed: RecordedEvent[] = [];
      const subscription = writer.subscribe({ after: start, handle: async (events) => void handed.push(...events) });
      await within(waitLimitMs, subscription.caughtUp(), 'the subscription catches up');
      await subscription.stop();
      same(handed, 'a subscription');
      // a skipping subscription reads the marked events' metadata as any other's
      const typed: RecordedEvent[] = [];
      const typedSubscription = writer.subscribe({ after: start, eventTypes: ['Hostile'], handle: async (events) => void typed.push(...events) });
      await within(waitLimitMs, typedSubscription.caughtUp(), 'the typed subscription catches up');
      await typedSubscription.stop();
      assert.is(typed.filter((e) => expected.has(e.id)).length, 4);
      assert.ok(typed.every((e) => e.type === 'Hostile'));
      for (const e of typed.filter((t) => expected.has(t.id))) assert.equal({ data: e.data, metadata: e.metadata }, expected.get(e.id));
      // the rows as SQL sees them: marked events only (data readers of the table, such as an analyst, see the escaped form)
      const { rows } = await writer.query<{ event_id: string; marked: boolean }>(
        `SELECT event_id::text, metadata ? (U&'\\E000' || 'escaped') AS marked FROM events WHERE event_id = ANY($1::uuid[])`,
        [hostile.map((e) => e.id)],
      );
      assert.equal(new Map(rows.map((r) => [r.event_id, r.marked])), new Map(hostile.map((e, i) => [e.id, i < 3])));
    } finally {
      await writer.close();
    }
  });

  it('a stream id or event type with U+0000 or a lone surrogate is refused with InvalidEvent, alone, before it reaches a batch', async () => {
    const batchErrors: unknown[] = [];
    const writer = await adapter.open({ onBatchError: (error) => batchErrors.push(error) });
    try {
      const bad: [string, string, 'stream_id' | 'event_type'][] = [
        [`bad-\u0000-${randomUUID()}`, 'T', 'stream_id'],
        [`bad-\ud800-${randomUUID()}`, 'T', 'stream_id'],
        [uniqueStream(), 'T\u0000', 'event_type'],
        [uniqueStream(), '\udc00T', 'event_type'],
      ];
      const ordinary = Array.from({ length: 8 }, () => uniqueStream());
      const settled = await Promise.allSettled([
        ...ordinary.slice(0, 4).map((s) => writer.append(s, [event()], 'no_stream')),
        ...bad.map(([stream, type]) => writer.append(stream, [event(type)], 'any')),
        ...ordinary.slice(4).map((s) => writer.append(s, [event()], 'no_stream')),
      ]);
      assert.ok(settled.slice(0, 4).concat(settled.slice(8)).every((r) => r.status === 'fulfilled'), 'the ordinary appends succeed');
      settled.slice(4, 8).forEach((r, i) => {
        assert.is(r.status, 'rejected');
        const error = (r as PromiseRejectedResult).reason;
        assert.instance(error, InvalidEvent);
        assert.is((error as InvalidEvent).field, bad[i][2]);
      });
      assert.equal(batchErrors, []);
      await rejectsWith(writer.transaction((tx) => tx.append(`t-\u0000`, [event()], 'any')), InvalidEvent);
      const { rows } = await writer.query<{ n: string | number }>(`SELECT count(*) AS n FROM events WHERE stream_id LIKE 'bad-%'`);
      assert.is(Number(rows[0].n), 0);
    } finally {
      await writer.close();
    }
  });

  it('a value JSON cannot hold (a BigInt) fails its own append at once, not its batch', async () => {
    const batchErrors: unknown[] = [];
    const writer = await adapter.open({ onBatchError: (error) => batchErrors.push(error) });
    try {
      const settled = await Promise.allSettled([
        writer.append(uniqueStream(), [event()], 'no_stream'),
        writer.append(uniqueStream(), [event('T', { n: 1n })], 'no_stream'),
        writer.append(uniqueStream(), [event()], 'no_stream'),
      ]);
      assert.equal(settled.map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled']);
      assert.instance((settled[1] as PromiseRejectedResult).reason, TypeError);
      assert.equal(batchErrors, []);
    } finally {
      await writer.close();
    }
  });

  it('ping answers with latency', async ({ store }) => {
    const result = await store.ping(2000);
    assert.is(result.ok, true);
    assert.type(result.latencyMs, 'number');
  });

  it.run();
}
