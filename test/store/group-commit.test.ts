/** Group commit on its own (no database): who goes in which batch, and what one failure touches. */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { GroupCommitter, type BatchOutcome, type PendingAppend } from '../../src/store/group-commit.ts';
import { StoreUnavailable } from '../../src/store/errors.ts';
import { within } from '../support/within.ts';

const ok = (): BatchOutcome => ({ ok: { nextExpectedVersion: 1, lastPosition: { transactionId: 1, position: 1 }, idempotent: false } });
const append = (streamId: string, events = 1): PendingAppend => ({
  streamId,
  events: Array.from({ length: events }, (_, i) => ({ id: `${streamId}-${i}`, type: 'T', data: {} })),
  expected: 'any',
  encoded: { data: '', metadata: '' },
});

/** A fake database: records batches; each batch completes when the test says so. */
function recorder(maxInFlight = 1, maxBatchEvents = 1000) {
  const batches: string[][] = [];
  const release: (() => void)[] = [];
  let decide = (batch: PendingAppend[]): BatchOutcome[] => batch.map(ok);
  const committer = new GroupCommitter({
    maxInFlight,
    maxBatchEvents,
    async execute(batch) {
      batches.push(batch.map((a) => a.streamId));
      await new Promise<void>((resolve) => release.push(resolve));
      return decide(batch);
    },
  });
  // A batch leaves at the end of the turn after the one its first append came in.
  const turn = () => new Promise((r) => setImmediate(() => setImmediate(r)));
  return {
    committer,
    batches,
    turn,
    async finishNext() {
      // A batch that never reaches the database fails the test here instead of spinning for ever.
      for (let turns = 0; release.length === 0; turns++) {
        if (turns === 1000) throw new Error('no batch reached the database within 1000 turns of the event loop');
        await turn();
      }
      release.shift()!();
      await turn();
    },
    setDecide(fn: typeof decide) {
      decide = fn;
    },
  };
}

const groupCommit = suite('group commit');
/** Each test waits on the committer to send or settle batches: one that never does fails that test within seconds. */
const it = Object.assign((name: string, test: () => Promise<void>) => groupCommit(name, () => within(2_000, test(), name)), { run: () => groupCommit.run() });

it('appends made in one turn of the event loop go in one batch', async () => {
  const db = recorder();
  const done = Promise.all(['a', 'b', 'c'].map((s) => db.committer.append(append(s))));
  await db.finishNext();
  await done;
  assert.equal(db.batches, [['a', 'b', 'c']]);
});

it('sendNow sends what is queued at once, in one batch, instead of at the end of the turn', async () => {
  const db = recorder();
  const done = Promise.all(['a', 'b'].map((s) => db.committer.append(append(s))));
  assert.equal(db.batches, [], 'nothing leaves while the turn goes on');
  db.committer.sendNow();
  assert.equal(db.batches, [['a', 'b']], 'sent at the call, both appends together');
  db.committer.sendNow(); // nothing queued: nothing sent
  await db.finishNext();
  await done;
  assert.equal(db.batches, [['a', 'b']], 'the turn-end pump found nothing left to send');
});

it('appends arriving while a batch is in flight wait and leave together', async () => {
  const db = recorder();
  const first = db.committer.append(append('a'));
  await db.turn();
  const rest = Promise.all(['b', 'c', 'd'].map((s) => db.committer.append(append(s))));
  await db.finishNext();
  await first;
  await db.finishNext();
  await rest;
  assert.equal(db.batches, [['a'], ['b', 'c', 'd']]);
});

it('one stream appears once per batch, and its appends keep their order', async () => {
  const db = recorder();
  const done = Promise.all([append('a'), append('b'), append('a'), append('c'), append('a')].map((a) => db.committer.append(a)));
  await db.finishNext();
  await db.finishNext();
  await db.finishNext();
  await done;
  assert.equal(db.batches, [['a', 'b', 'c'], ['a'], ['a']]);
});

it('a stream held by an in-flight batch is not sent in a parallel one', async () => {
  const db = recorder(2);
  const first = db.committer.append(append('a', 20));
  await db.turn();
  const rest = Promise.all([append('a', 20), append('b', 20)].map((a) => db.committer.append(a)));
  await db.turn();
  assert.equal(db.batches, [['a'], ['b']]);
  await db.finishNext();
  await first;
  await db.finishNext();
  await db.finishNext();
  await rest;
  assert.equal(db.batches, [['a'], ['b'], ['a']]);
});

it('what is queued is shared among free connections, in batches of at least 16 events', async () => {
  const db = recorder(2);
  const many = Promise.all(Array.from({ length: 64 }, (_, i) => db.committer.append(append(`s${i}`))));
  await db.turn();
  assert.equal(db.batches.map((b) => b.length), [32, 32]);
  await db.finishNext();
  await db.finishNext();
  await many;
  const few = Promise.all(Array.from({ length: 10 }, (_, i) => db.committer.append(append(`t${i}`))));
  await db.turn();
  assert.equal(db.batches.slice(2).map((b) => b.length), [10]);
  await db.finishNext();
  await few;
});

it('batches respect the event limit; a larger append goes alone', async () => {
  const db = recorder(1, 10);
  const done = Promise.all([append('a', 4), append('b', 4), append('c', 4), append('d', 30)].map((a) => db.committer.append(a)));
  for (let i = 0; i < 3; i++) await db.finishNext();
  await done;
  assert.equal(db.batches, [['a', 'b'], ['c'], ['d']]);
});

it("one append's conflict fails only that append", async () => {
  const db = recorder();
  db.setDecide((batch) => batch.map((a) => (a.streamId === 'bad' ? { error: new Error('conflict') } : ok())));
  const results = Promise.allSettled(['a', 'bad', 'c'].map((s) => db.committer.append(append(s))));
  await db.finishNext();
  assert.equal((await results).map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled']);
});

it('a batch that fails as a whole is retried append by append, so only the culprit fails', async () => {
  const db = recorder();
  db.setDecide((batch) => {
    if (batch.some((a) => a.streamId === 'poison')) throw new Error('batch failed');
    return batch.map(ok);
  });
  const results = Promise.allSettled(['a', 'poison', 'c'].map((s) => db.committer.append(append(s))));
  for (let i = 0; i < 4; i++) await db.finishNext();
  assert.equal((await results).map((r) => r.status), ['fulfilled', 'rejected', 'fulfilled']);
  assert.equal(db.batches, [['a', 'poison', 'c'], ['a'], ['poison'], ['c']]);
});

it('a batch that fails because the database is unavailable fails all its appends at once, none retried alone', async () => {
  const db = recorder();
  db.setDecide(() => {
    throw new StoreUnavailable('the connection stopped answering', true);
  });
  const results = Promise.allSettled(['a', 'b', 'c'].map((s) => db.committer.append(append(s))));
  await db.finishNext();
  const settled = await results;
  assert.equal(settled.map((r) => r.status), ['rejected', 'rejected', 'rejected']);
  assert.ok(settled.every((r) => (r as PromiseRejectedResult).reason instanceof StoreUnavailable));
  assert.equal(db.batches, [['a', 'b', 'c']]);
});

it('an append told to retry goes again in the next batch', async () => {
  const db = recorder();
  let first = true;
  db.setDecide((batch) =>
    batch.map((a) => {
      if (a.streamId === 'raced' && first) {
        first = false;
        return { retry: true };
      }
      return ok();
    }),
  );
  const results = Promise.all(['raced', 'b'].map((s) => db.committer.append(append(s))));
  await db.finishNext();
  await db.finishNext();
  await results;
  assert.equal(db.batches, [['raced', 'b'], ['raced']]);
});

it('drained resolves once nothing is queued or in flight', async () => {
  const db = recorder();
  let drained = false;
  const pending = db.committer.append(append('a'));
  await db.turn();
  const waiting = db.committer.drained().then(() => (drained = true));
  await db.turn();
  assert.is(drained, false);
  await db.finishNext();
  await pending;
  await waiting;
  assert.is(drained, true);
});

it.run();
