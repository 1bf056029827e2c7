// Which write a metered request makes first when its engine call starts alongside its reservation's
// append (src/api/write-order.ts): the longer wait first, per model, the engine first until measured.
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { WriteOrder } from '../../src/api/write-order.ts';

const test = suite('write order of an early engine call and its append');

test('the engine call goes first for a model not yet measured', () => {
  assert.is(new WriteOrder().appendFirst('m'), false);
});

test('the append goes first for an engine that answers sooner than a commit, per model', () => {
  const order = new WriteOrder();
  order.observe('instant', 0.4, 0.9);
  order.observe('slow', 20.3, 0.9);
  assert.is(order.appendFirst('instant'), true);
  assert.is(order.appendFirst('slow'), false);
  assert.is(order.appendFirst('unseen'), false);
});

test('a moving share: one odd request does not flip the order, a lasting change does', () => {
  const order = new WriteOrder();
  for (let i = 0; i < 20; i++) order.observe('m', 0.4, 0.9);
  order.observe('m', 30, 0.9); // one slow answer (a long prompt, say)
  assert.is(order.appendFirst('m'), true);
  for (let i = 0; i < 20; i++) order.observe('m', 25, 0.9); // the engine now takes longer than a commit
  assert.is(order.appendFirst('m'), false);
  for (let i = 0; i < 40; i++) order.observe('m', 0.4, 2.5); // and back, with the store slower too
  assert.is(order.appendFirst('m'), true);
});

test.run();
