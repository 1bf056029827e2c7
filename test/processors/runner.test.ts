/** Projection runner: checkpointed catch-up then live, one transaction per batch, rebuild, CLI. */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import { ProjectionRunner, runProjectionsCommand, type Projection } from '../../src/processors/index.ts';
import type { EventStore, RecordedEvent } from '../../src/store/index.ts';
import { adaptersUnderTest, deferred } from '../store/adapters.ts';
import { lastEventProjection, ledgerProjection, tableRows } from './fixtures.ts';
import { until } from '../support/until.ts';

const settled = (tokens: number) => ({ id: randomUUID(), type: 'RequestSettled', data: { tokens } });
const noise = () => ({ id: randomUUID(), type: 'Unrelated', data: {} });

async function totalsOf(store: EventStore, streamId: string): Promise<{ requests: number; tokens: number } | null> {
  const { rows } = await store.query<{ requests: string | number; tokens: string | number }>(
    'SELECT requests, tokens FROM test_ledger_totals WHERE stream_id = $1',
    [streamId],
  );
  return rows.length === 0 ? null : { requests: Number(rows[0].requests), tokens: Number(rows[0].tokens) };
}

/** Wraps a projection to count the events it is given. */
function counted(projection: Projection): Projection & { applied: RecordedEvent[] } {
  const applied: RecordedEvent[] = [];
  return {
    ...projection,
    applied,
    async apply(events, db) {
      await projection.apply(events, db);
      applied.push(...events);
    },
  };
}

function collect(): { write(text: string): void; text: string } {
  return {
    text: '',
    write(text: string) {
      this.text += text;
    },
  };
}

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore }>(`projection runner (${adapter.name})`);
  it.before(async (context) => {
    context.store = await adapter.open({ pollIntervalMs: 200 });
  });
  it.after(async (context) => {
    await context.store?.close();
    await adapter.cleanup();
  });

  it('catches up on events committed before it started, then applies live ones', async ({ store }) => {
    const meter = `meter-${randomUUID()}`;
    await store.append(meter, [settled(10), noise(), settled(5)], 'no_stream');
    const runner = new ProjectionRunner({ store, projections: [ledgerProjection, lastEventProjection] });
    await runner.start();
    await runner.caughtUp();
    assert.equal(await totalsOf(store, meter), { requests: 2, tokens: 15 });
    await store.append(meter, [settled(1)], 3);
    await runner.caughtUp();
    assert.equal(await totalsOf(store, meter), { requests: 3, tokens: 16 });
    const { rows } = await store.query<{ event_type: string; stream_version: string | number }>('SELECT event_type, stream_version FROM test_last_event WHERE stream_id = $1', [meter]);
    assert.equal(rows.map((r) => [r.event_type, Number(r.stream_version)]), [['RequestSettled', 4]]);
    await runner.stop();
  });

  it('rows and checkpoint move in one transaction: a failing batch leaves neither, and is retried', async ({ store }) => {
    const failing = { on: true };
    const errors: unknown[] = [];
    const sawError = deferred();
    const poisoned: Projection = {
      ...ledgerProjection,
      name: 'test_poisoned',
      async apply(events, db) {
        await ledgerProjection.apply(events, db); // writes rows, then fails: the transaction must undo them
        if (failing.on && events.some((e) => (e.data as { tokens: number }).tokens === 666)) throw new Error('poison');
      },
    };
    // Its own tables, so the ledger projection's rows do not mask the rollback.
    const runner = new ProjectionRunner({ store, projections: [poisoned], pollIntervalMs: 50, onError: (_, e) => (errors.push(e), sawError.resolve()) });
    await runner.start();
    await runner.caughtUp();
    const [before] = await runner.status();
    const meter = `meter-${randomUUID()}`;
    await store.append(meter, [settled(1), settled(666)], 'no_stream');
    await sawError.promise;
    assert.equal(await totalsOf(store, meter), null, 'no rows from the failed batch');
    const [during] = await runner.status();
    assert.equal(during.position, before.position, 'checkpoint unchanged');
    assert.is(during.lag, 2);
    failing.on = false;
    await runner.caughtUp();
    assert.equal(await totalsOf(store, meter), { requests: 2, tokens: 667 });
    assert.ok(errors.length >= 1);
    await runner.stop();
  });

  it('live projections read the log once between them, and each batch moves all their checkpoints together', async ({ store }) => {
    let subscriptions = 0;
    const counting: EventStore = { ...store, subscribe: (options) => (subscriptions++, store.subscribe(options)) };
    const runner = new ProjectionRunner({ store: counting, projections: [{ ...ledgerProjection, name: 'test_shared_a' }, { ...lastEventProjection, name: 'test_shared_b' }] });
    await runner.start();
    const meter = `meter-${randomUUID()}`;
    await store.append(meter, [settled(2), settled(3)], 'no_stream');
    await runner.caughtUp();
    assert.is(subscriptions, 1, 'one reader for both projections');
    assert.equal(await totalsOf(store, meter), { requests: 2, tokens: 5 });
    const [a, b] = await runner.status();
    assert.equal(a.position, b.position);
    assert.equal(a.position, await store.head());
    await runner.stop();
  });

  it('a projection that fails among others is set apart: the others keep applying, it retries alone until it succeeds', async ({ store }) => {
    const failing = { on: true };
    const failures: string[] = [];
    // Tables of its own (a renamed copy of the fixture's last-event projection would share them).
    const poisoned: Projection = {
      name: 'test_poisoned_apart',
      tables: ['test_poisoned_apart'],
      async init(db) {
        await db.query('CREATE TABLE IF NOT EXISTS test_poisoned_apart (stream_id text PRIMARY KEY, tokens bigint NOT NULL)');
      },
      async apply(events, db) {
        if (failing.on && events.some((e) => (e.data as { tokens?: number }).tokens === 4242)) throw new Error('poison');
        for (const e of events) {
          await db.query('INSERT INTO test_poisoned_apart (stream_id, tokens) VALUES ($1, $2) ON CONFLICT (stream_id) DO UPDATE SET tokens = excluded.tokens', [e.streamId, (e.data as { tokens?: number }).tokens ?? 0]);
        }
      },
    };
    const healthy = { ...ledgerProjection, name: 'test_healthy_beside' };
    const runner = new ProjectionRunner({ store, projections: [healthy, poisoned], pollIntervalMs: 50, onError: (name) => failures.push(name) });
    await runner.start();
    await runner.caughtUp();
    const meter = `meter-${randomUUID()}`;
    await store.append(meter, [settled(1), settled(4242)], 'no_stream');
    assert.equal(await until('the healthy projection to apply the batch', () => totalsOf(store, meter)), { requests: 2, tokens: 4243 });
    const [ahead, behind] = await runner.status();
    assert.is(ahead.lag, 0);
    assert.is(behind.lag, 2, "the failing projection's checkpoint stays before the batch");
    assert.ok(failures.length >= 1 && failures.every((name) => name === 'test_poisoned_apart'));
    failing.on = false;
    await runner.caughtUp();
    const { rows } = await store.query<{ tokens: string | number }>('SELECT tokens FROM test_poisoned_apart WHERE stream_id = $1', [meter]);
    assert.equal(rows.map((r) => Number(r.tokens)), [4242]);
    await runner.stop();
  });

  it('replaying the same events twice gives the same rows', async ({ store }) => {
    const meter = `meter-${randomUUID()}`;
    await store.append(meter, [settled(3), settled(4)], 'no_stream');
    const events = (await store.readStream(meter)).events;
    await store.transaction(async (tx) => {
      await ledgerProjection.init(tx);
      await ledgerProjection.apply(events, tx);
    });
    const once = await totalsOf(store, meter);
    await store.transaction((tx) => ledgerProjection.apply(events, tx));
    assert.equal(await totalsOf(store, meter), once);
    assert.equal(once, { requests: 2, tokens: 7 });
  });

  it('a restarted runner continues from its checkpoint without applying anything twice', async ({ store }) => {
    const first = counted({ ...ledgerProjection, name: 'test_restart' });
    const runner = new ProjectionRunner({ store, projections: [first] });
    await runner.start();
    await runner.caughtUp();
    await runner.stop();
    const meter = `meter-${randomUUID()}`;
    await store.append(meter, [settled(2), settled(2)], 'no_stream');
    const second = counted({ ...ledgerProjection, name: 'test_restart' });
    const again = new ProjectionRunner({ store, projections: [second] });
    await again.start();
    await again.caughtUp();
    assert.equal(second.applied.map((e) => e.streamId), [meter, meter]);
    await again.stop();
  });

  it('two runners of one projection (two processes) apply every event exactly once', async ({ store }) => {
    const other = adapter.name === 'postgres' ? await adapter.open() : store;
    try {
      const a = counted({ ...ledgerProjection, name: 'test_twins' });
      const b = counted({ ...ledgerProjection, name: 'test_twins' });
      const runnerA = new ProjectionRunner({ store, projections: [a], batchSize: 3, pollIntervalMs: 20 });
      const runnerB = new ProjectionRunner({ store: other, projections: [b], batchSize: 3, pollIntervalMs: 20 });
      await Promise.all([runnerA.start(), runnerB.start()]);
      await Promise.all([runnerA.caughtUp(), runnerB.caughtUp()]);
      a.applied.length = 0;
      b.applied.length = 0;
      const meters = Array.from({ length: 8 }, () => `meter-${randomUUID()}`);
      await Promise.all(meters.map((m) => store.append(m, [settled(1), settled(2), settled(3)], 'no_stream')));
      await Promise.all([runnerA.caughtUp(), runnerB.caughtUp()]);
      const ids = [...a.applied, ...b.applied].map((e) => e.id);
      assert.is(ids.length, 24);
      assert.is(new Set(ids).size, 24);
      await Promise.all([runnerA.stop(), runnerB.stop()]);
    } finally {
      if (other !== store) await other.close();
    }
  });

  it('status reports the lag of every projection', async ({ store }) => {
    const runner = new ProjectionRunner({ store, projections: [{ ...ledgerProjection, name: 'test_status' }] });
    const meter = `meter-${randomUUID()}`;
    await store.append(meter, [settled(1)], 'no_stream');
    await store.readable();
    const [idle] = await runner.status();
    assert.is(idle.name, 'test_status');
    assert.is(idle.lag, await store.countAfter({ transactionId: 0, position: 0 }));
    assert.is(idle.updatedAt, null);
    await runner.start();
    await runner.caughtUp();
    const [live] = await runner.status();
    assert.is(live.lag, 0);
    assert.is(live.live, true);
    assert.equal(live.position, await store.head());
    await runner.stop();
  });

  it('rebuild replays into new tables and swaps them in: equal row for row, views survive, readers never see a part-built table', async ({ store }) => {
    const runner = new ProjectionRunner({ store, projections: [ledgerProjection, lastEventProjection], rebuildBatchSize: 7 });
    await runner.start();
    for (let i = 0; i < 5; i++) {
      const meter = `meter-${randomUUID()}`;
      await store.append(meter, [settled(i), noise(), settled(i * 2), { id: randomUUID(), type: 'KeyPaused', data: {} }], 'no_stream');
    }
    await runner.caughtUp();
    const live = {
      rows: await tableRows(store, 'test_ledger_rows'),
      totals: await tableRows(store, 'test_ledger_totals'),
      last: await tableRows(store, 'test_last_event'),
    };
    assert.ok(live.rows.length >= 10);
    // an analyst's view over a projection table, and readers sampling the tables during the rebuild
    await store.query('CREATE OR REPLACE VIEW test_ledger_view AS SELECT stream_id, tokens FROM test_ledger_totals');
    const viewBefore = await tableRows(store, 'test_ledger_view');
    const progress: number[] = [];
    const seenByReaders: Promise<number>[] = [];
    const report = await runner.rebuild('test_ledger', (p) => {
      progress.push(p.done);
      seenByReaders.push(store.query<{ n: string | number }>('SELECT count(*) AS n FROM test_ledger_rows').then((r) => Number(r.rows[0].n)));
    });
    assert.equal(await Promise.all(seenByReaders), seenByReaders.map(() => live.rows.length), 'readers always see the whole table');
    assert.equal(await tableRows(store, 'test_ledger_view'), viewBefore, 'the view survives the rebuild');
    const reportLast = await runner.rebuild('test_last_event');
    assert.is(report.events, await store.countAfter({ transactionId: 0, position: 0 }));
    assert.ok(report.eventsPerSecond > 0);
    assert.ok(progress.length > 1 && progress[progress.length - 1] === report.events);
    assert.is(reportLast.events, report.events);
    assert.equal(await tableRows(store, 'test_ledger_rows'), live.rows);
    assert.equal(await tableRows(store, 'test_ledger_totals'), live.totals);
    assert.equal(await tableRows(store, 'test_last_event'), live.last);
    // live application resumed after the rebuild
    const meter = `meter-${randomUUID()}`;
    await store.append(meter, [settled(9)], 'no_stream');
    await runner.caughtUp();
    assert.equal(await totalsOf(store, meter), { requests: 1, tokens: 9 });
    await runner.stop();
  });

  it('a live runner follows when another process rebuilds its projection', async ({ store }) => {
    const other = adapter.name === 'postgres' ? await adapter.open() : store;
    try {
      const live = new ProjectionRunner({ store, projections: [ledgerProjection], pollIntervalMs: 20 });
      await live.start();
      await live.caughtUp();
      const before = await tableRows(store, 'test_ledger_totals');
      await new ProjectionRunner({ store: other, projections: [ledgerProjection] }).rebuild('test_ledger');
      const meter = `meter-${randomUUID()}`;
      await store.append(meter, [settled(4)], 'no_stream');
      await live.caughtUp();
      const after = (await tableRows(store, 'test_ledger_totals')) as { stream_id: string }[];
      assert.equal(after.filter((r) => r.stream_id !== meter), before);
      assert.equal(await totalsOf(store, meter), { requests: 1, tokens: 4 });
      await live.stop();
    } finally {
      if (other !== store) await other.close();
    }
  });

  it('svc projections status and rebuild print lag, progress and events/s', async ({ store }) => {
    const stdout = collect();
    const stderr = collect();
    const io = { store, projections: [ledgerProjection], stdout, stderr };
    assert.is(await runProjectionsCommand(['status'], io), 0);
    assert.match(stdout.text, /^projection\s+checkpoint\s+lag\s+updated\s+holder\s+until\n/);
    assert.match(stdout.text, /test_ledger\s+\d+\/\d+\s+[\d,]+\s+\S+/);
    stdout.text = '';
    assert.is(await runProjectionsCommand(['status', '--json'], io), 0);
    const [json] = JSON.parse(stdout.text) as { name: string; lag: number }[];
    assert.is(json.name, 'test_ledger');
    stdout.text = '';
    assert.is(await runProjectionsCommand(['rebuild', 'test_ledger'], io), 0);
    assert.match(stdout.text, /^rebuilt test_ledger: [\d,]+ events in [\d.]+ s \([\d,]+ events\/s\)\n$/);
    assert.match(stderr.text, /test_ledger \[#+\] 100% /);
    assert.is(await runProjectionsCommand(['rebuild', 'nope'], io), 2);
    assert.match(stderr.text, /unknown projection "nope"; known: test_ledger/);
    assert.is(await runProjectionsCommand(['frobnicate'], io), 2);
    assert.match(stderr.text, /usage: svc projections/);
  });

  it.run();
}
