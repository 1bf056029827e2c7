/** The spend decider, given / when / then: the daily cap's threshold is its rule. */
import { suite } from 'uvu';
import { spendDecider } from '../../commands/spend.ts';
import { SpendCapReached } from '../../events/spend.ts';
import { deciderSpecification } from '../support/decider-specification.ts';

const it = suite('spend decider');
const spec = deciderSpecification(spendDecider);
const day = '2026-11-26';
const now = `${day}T12:00:00.000Z`;
const check = (spend: number, cap: number | null) => ({ type: 'CheckSpend' as const, day, spend, cap, now });

it('a spend under the cap reaches nothing', () => {
  spec.given([]).when(check(99.99, 100)).thenNothing();
});

it('a spend at the cap reaches it', () => {
  spec.given([]).when(check(100, 100)).then([SpendCapReached({ day, spend: 100, cap: 100, at: now })]);
});

it('a spend over the cap reaches it, recording the spend and the cap it was decided under', () => {
  spec.given([]).when(check(130.5, 100)).then([SpendCapReached({ day, spend: 130.5, cap: 100, at: now })]);
});

it('with no cap, no spend reaches anything', () => {
  spec.given([]).when(check(1e9, null)).thenNothing();
});

it('the cap is reached once a day: a second report over it appends nothing', () => {
  spec.given([SpendCapReached({ day, spend: 100, cap: 100, at: now })]).when(check(150, 100)).thenNothing();
});

it.run();
