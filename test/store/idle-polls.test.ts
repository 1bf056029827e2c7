/**
 * What an idle subscription asks the database: one read per poll, not a read and a look at the log's
 * last commit (that look is for a reader woken by a commit it cannot read yet). Counted on the
 * drivers' own query calls, on PGlite and (with DATABASE_URL) PostgreSQL.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import type { RecordedEvent } from '../../src/store/index.ts';
import { adaptersUnderTest, event, uniqueStream } from './adapters.ts';
import { settledHead, sleep, waitLimitMs } from './log-contract.ts';
import { within } from '../support/within.ts';
import { countingQueries } from '../support/counting-queries.ts';

const isRead = (sql: string) => /^SELECT global_position, transaction_id::text AS tx/.test(sql.trim()) || sql.includes('scanned');
/** lastCommitted: the log's last commit, readable yet or not (no visibility rule). */
const isLastCommitted = (sql: string) => /ORDER BY transaction_id DESC, global_position DESC LIMIT 1/.test(sql) && !sql.includes('pg_snapshot_xmin');

const adapters = adaptersUnderTest();
for (const adapter of adapters) {
  const it = suite(`idle subscriptions (${adapter.name})`);

  it('an idle subscription polls with one read a poll, and still takes a commit made meanwhile', async () => {
    const store = await adapter.open({ pollIntervalMs: 10 });
    try {
      await countingQueries(async (sent) => {
        const stream = uniqueStream();
        await store.append(stream, [event('Before')], 'no_stream');
        const seen: RecordedEvent[] = [];
        const all = store.subscribe({ after: await settledHead(store), pollIntervalMs: 10, handle: async (events) => void seen.push(...events) });
        const typed = store.subscribe({ after: await settledHead(store), pollIntervalMs: 10, eventTypes: ['Live'], handle: async (events) => void seen.push(...events) });
        await within(waitLimitMs, Promise.all([all.caughtUp(), typed.caughtUp()]), 'caught up');
        await sleep(50); // the reads after catching up
        sent.length = 0;
        for (let i = 0; i < 200 && sent.filter(isRead).length < 20; i++) await sleep(10);
        const idle = [...sent];
        assert.ok(idle.filter(isRead).length >= 20, `polled ${idle.filter(isRead).length} times`);
        assert.is(idle.filter(isLastCommitted).length, 0, 'no look at the last commit in idle polls');
        // A commit still arrives, once, to both.
        await store.append(stream, [event('Live')], 1);
        await within(waitLimitMs, Promise.all([all.caughtUp(), typed.caughtUp()]), 'caught up with the commit');
        assert.equal(seen.map((e) => e.type), ['Live', 'Live']);
        await all.stop();
        await typed.stop();
      });
    } finally {
      await store.close();
    }
  });

  it.after(async () => {
    await adapter.cleanup();
  });
  it.run();
}
