/** The meter's minute of request starts: a value that is cheap to extend. */
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { StartWindow } from '../../deciders/start-window.ts';

test('extending a window leaves it and every other window as they were', () => {
  const a = StartWindow.of([10, 20]);
  const b = a.with(30); // extends the shared array in place
  const c = a.with(25); // a second extension of `a`: must not see 30
  const d = b.with(40);
  assert.equal(a.toArray(), [10, 20]);
  assert.equal(b.toArray(), [10, 20, 30]);
  assert.equal(c.toArray(), [10, 20, 25]);
  assert.equal(d.toArray(), [10, 20, 30, 40]);
  assert.equal(b.with(35).toArray(), [10, 20, 30, 35]);
  assert.equal(d.toArray(), [10, 20, 30, 40]);
});

test('starts come in time order whatever order they arrive in', () => {
  assert.equal(StartWindow.of([30, 10, 20]).toArray(), [10, 20, 30]);
  const w = StartWindow.of([10, 30]).with(20).with(5).with(30);
  assert.equal(w.toArray(), [5, 10, 20, 30, 30]);
  assert.is(w.at(0), 5);
  assert.is(w.at(4), 30);
  assert.throws(() => w.at(5), /start 5 of a window of 5/);
});

test('since keeps only the later starts and copies nothing of the rest', () => {
  const w = StartWindow.of([1, 2, 3, 4, 5]);
  assert.equal(w.since(3).toArray(), [4, 5]);
  assert.equal(w.since(0).toArray(), [1, 2, 3, 4, 5]);
  assert.is(w.since(5).size, 0);
  assert.equal(w.since(3).with(6).toArray(), [4, 5, 6]);
  assert.equal(w.toArray(), [1, 2, 3, 4, 5]);
  assert.equal(StartWindow.empty.with(1).toArray(), [1]);
  assert.equal(StartWindow.empty.toArray(), []);
});

test('a sliding minute of many starts stays exact as its backing array is compacted', () => {
  let w = StartWindow.empty;
  const kept: number[] = [];
  for (let t = 0; t < 20_000; t += 7) {
    w = w.since(t - 600).with(t);
    kept.push(t);
    while (kept[0] <= t - 600) kept.shift();
  }
  assert.equal(w.toArray(), kept);
  assert.equal(JSON.parse(JSON.stringify({ starts: w })), { starts: kept });
});

test.run();
