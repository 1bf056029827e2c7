/**
 * The billing basis, table-driven: what a finished request is billed from (the engine's usage, the
 * frames relayed before a stream broke off, the whole hold of a broken body, or nothing when the engine
 * never answered) and its cost from GPU seconds.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { billingBasis, type BilledRequest, type BillingBasis, type RelayedOutcome } from '../../commands/billing.ts';

/** Two prompts of 12 tokens in all, n = 3, max_tokens 50 after any clamp: a hold of 2 × 3 × 50 = 300 output tokens. */
const request = (stream: boolean): BilledRequest => ({ stream, promptTokens: 12, promptCount: 2, n: 3, maxTokens: 50 });
const gpu = { seconds: 2.5, costPerSecond: 0.004 };
const engineUsage = { prompt_tokens: 11, completion_tokens: 42 };

const cases: { name: string; relayed: RelayedOutcome | null; stream: boolean; expected: Omit<BillingBasis, 'gpuSeconds' | 'cost'> }[] = [
  {
    name: 'a body that came through whole: the engine usage',
    relayed: { usage: engineUsage, contentFrames: 0, completed: true },
    stream: false,
    expected: { basis: 'engine_usage', inputTokens: 11, outputTokens: 42, disconnected: false },
  },
  {
    name: 'a stream with its usage frame: the engine usage, not the frames counted',
    relayed: { usage: engineUsage, contentFrames: 40, completed: true },
    stream: true,
    expected: { basis: 'engine_usage', inputTokens: 11, outputTokens: 42, disconnected: false },
  },
  {
    name: 'a stream the client left after its usage frame: the engine usage, disconnected',
    relayed: { usage: engineUsage, contentFrames: 42, completed: false },
    stream: true,
    expected: { basis: 'engine_usage', inputTokens: 11, outputTokens: 42, disconnected: true },
  },
  {
    name: 'a stream that broke off: the prompt plus one token per content frame relayed',
    relayed: { usage: null, contentFrames: 17, completed: false },
    stream: true,
    expected: { basis: 'relayed_frames', inputTokens: 12, outputTokens: 17, disconnected: true },
  },
  {
    name: 'a stream the client left before any frame: the prompt alone',
    relayed: { usage: null, contentFrames: 0, completed: false },
    stream: true,
    expected: { basis: 'relayed_frames', inputTokens: 12, outputTokens: 0, disconnected: true },
  },
  {
    name: 'a non-streaming body that broke off: the prompt plus the whole hold (prompts × n × max_tokens)',
    relayed: { usage: null, contentFrames: 0, completed: false },
    stream: false,
    expected: { basis: 'whole_hold', inputTokens: 12, outputTokens: 300, disconnected: true },
  },
  {
    name: 'a non-streaming body that ended without a usage object: the whole hold, not disconnected',
    relayed: { usage: null, contentFrames: 0, completed: true },
    stream: false,
    expected: { basis: 'whole_hold', inputTokens: 12, outputTokens: 300, disconnected: false },
  },
  {
    name: 'the engine never answered (an upstream error): no tokens',
    relayed: null,
    stream: false,
    expected: { basis: 'not_run', inputTokens: 0, outputTokens: 0, disconnected: false },
  },
  {
    name: 'a stream whose engine never answered: no tokens either',
    relayed: null,
    stream: true,
    expected: { basis: 'not_run', inputTokens: 0, outputTokens: 0, disconnected: false },
  },
];

const it = suite('billing basis');
for (const c of cases) {
  it(c.name, () => {
    const billed = billingBasis(c.relayed, request(c.stream), gpu);
    assert.equal(billed, { ...c.expected, gpuSeconds: 2.5, cost: 2.5 * 0.004 });
  });
}
it('cost is GPU seconds times the price per second, on every basis', () => {
  for (const relayed of [null, { usage: null, contentFrames: 3, completed: false }, { usage: engineUsage, contentFrames: 0, completed: true }]) {
    assert.is(billingBasis(relayed, request(true), { seconds: 0, costPerSecond: 0.004 }).cost, 0);
    assert.is(billingBasis(relayed, request(true), { seconds: 10, costPerSecond: 0.25 }).cost, 2.5);
    assert.is(billingBasis(relayed, request(true), { seconds: 10, costPerSecond: 0 }).cost, 0);
  }
});
it.run();
