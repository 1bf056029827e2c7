/** The spend decider, given / when / then: the daily cap's threshold is its rule, in integer micro-units. */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { spendCapPauses, spendDecider } from '../../deciders/spend.ts';
import { SpendCapReached, spendEvents } from '../../events/spend.ts';
import { deciderSpecification } from '../support/decider-specification.ts';

const it = suite('spend decider');
const spec = deciderSpecification(spendDecider);
const day = '2026-11-26';
const now = `${day}T12:00:00.000Z`;
/** Spend and cap in micro-units. */
const check = (spendMicros: number, capMicros: number | null) => ({ type: 'CheckSpend' as const, day, spendMicros, capMicros, now });
const reached = (spend: number, cap: number) => SpendCapReached({ day, at: now, spend_micros: spend, cap_micros: cap });

it('a spend under the cap reaches nothing, by one micro-unit', () => {
  spec.given([]).when(check(99_999_999, 100_000_000)).thenNothing();
});

it('a spend at the cap reaches it', () => {
  spec.given([]).when(check(100_000_000, 100_000_000)).then([reached(100_000_000, 100_000_000)]);
});

it('a spend over the cap reaches it, recording the spend and the cap it was decided under', () => {
  spec.given([]).when(check(130_500_000, 100_000_000)).then([reached(130_500_000, 100_000_000)]);
});

it('with no cap, no spend reaches anything', () => {
  spec.given([]).when(check(1e15, null)).thenNothing();
});

it('the cap is reached once a day: a second report over it appends nothing', () => {
  spec.given([reached(100_000_000, 100_000_000)]).when(check(150_000_000, 100_000_000)).thenNothing();
});

it('a version-1 SpendCapReached (floats) reads with its figures to the micro-unit', () => {
  const v1 = spendEvents.parse({ type: 'SpendCapReached', data: { day, spend: 0.30000000000000004, cap: 0.3, at: now }, metadata: {} });
  assert.equal(v1.data, { day, at: now, spend_micros: 300_000, cap_micros: 300_000 });
});

it('the cap pauses the service on the day it was reached only; the next UTC day resumes', () => {
  assert.is(spendCapPauses(null, new Date('2026-11-26T12:00:00Z')), false);
  assert.is(spendCapPauses('2026-11-26', new Date('2026-11-26T23:59:59.999Z')), true);
  assert.is(spendCapPauses('2026-11-26', new Date('2026-11-27T00:00:00Z')), false);
  assert.is(spendCapPauses('2026-11-26', new Date('2026-11-25T23:59:59Z')), false);
});

it.run();
