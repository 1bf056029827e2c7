/**
 * The billing basis, table-driven: what a finished request is billed from (the engine's usage, the
 * frames relayed before a stream broke off, the whole hold of a broken body, or nothing when the engine
 * never answered) and its cost from GPU seconds.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { billingBasis, chargeMicros, toMicros, type BilledRequest, type BillingBasis, type RelayedOutcome } from '../../deciders/billing.ts';

/** Two prompts of 12 tokens in all, n = 3, max_tokens 50 after any clamp: a hold of 2 × 3 × 50 = 300 output tokens. */
const request = (stream: boolean): BilledRequest => ({ stream, promptTokens: 12, promptCount: 2, n: 3, maxTokens: 50 });
const gpu = { seconds: 2.5, costPerSecond: 0.004 };
const engineUsage = { prompt_tokens: 11, completion_tokens: 42 };

const cases: { name: string; relayed: RelayedOutcome | null; stream: boolean; expected: Omit<BillingBasis, 'gpuSeconds' | 'costMicros' | 'pricePerGpuSecondMicros' | 'generatedOutputTokens' | 'relayedOutputTokens'> & Partial<BillingBasis> }[] = [
  {
    name: 'a body that came through whole: the engine usage',
    relayed: { usage: engineUsage, contentFrames: 0, relayedFrames: 0, completed: true },
    stream: false,
    expected: { basis: 'engine_usage', inputTokens: 11, outputTokens: 42, disconnected: false },
  },
  {
    name: 'a stream with its usage frame: the engine usage, not the frames counted',
    relayed: { usage: engineUsage, contentFrames: 40, relayedFrames: 38, completed: true },
    stream: true,
    expected: { basis: 'engine_usage', inputTokens: 11, outputTokens: 42, disconnected: false },
  },
  {
    name: 'a stream the client left after its usage frame: the engine usage, disconnected; generated is the usage, relayed what the socket took',
    relayed: { usage: engineUsage, contentFrames: 42, relayedFrames: 40, completed: false },
    stream: true,
    expected: { basis: 'engine_usage', inputTokens: 11, outputTokens: 42, disconnected: true, generatedOutputTokens: 42, relayedOutputTokens: 40 },
  },
  {
    name: 'a stream that broke off: the prompt plus one token per content frame received; generated and relayed recorded',
    relayed: { usage: null, contentFrames: 17, relayedFrames: 15, completed: false },
    stream: true,
    expected: { basis: 'relayed_frames', inputTokens: 12, outputTokens: 17, disconnected: true, generatedOutputTokens: 17, relayedOutputTokens: 15 },
  },
  {
    name: 'a stream the client left before any frame: the prompt alone',
    relayed: { usage: null, contentFrames: 0, relayedFrames: 0, completed: false },
    stream: true,
    expected: { basis: 'relayed_frames', inputTokens: 12, outputTokens: 0, disconnected: true, generatedOutputTokens: 0, relayedOutputTokens: 0 },
  },
  {
    name: 'a non-streaming body that broke off: the prompt plus the whole hold (prompts × n × max_tokens)',
    relayed: { usage: null, contentFrames: 0, relayedFrames: 0, completed: false },
    stream: false,
    expected: { basis: 'whole_hold', inputTokens: 12, outputTokens: 300, disconnected: true },
  },
  {
    name: 'a non-streaming body that ended without a usage object: the whole hold, not disconnected',
    relayed: { usage: null, contentFrames: 0, relayedFrames: 0, completed: true },
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
    assert.equal(billed, { gpuSeconds: 2.5, pricePerGpuSecondMicros: 4000, costMicros: 10_000, generatedOutputTokens: null, relayedOutputTokens: null, ...c.expected });
  });
}
it('cost is GPU seconds times the price per second, in integer micro-units, on every basis', () => {
  for (const relayed of [null, { usage: null, contentFrames: 3, relayedFrames: 1, completed: false }, { usage: engineUsage, contentFrames: 0, relayedFrames: 0, completed: true }]) {
    assert.is(billingBasis(relayed, request(true), { seconds: 0, costPerSecond: 0.004 }).costMicros, 0);
    assert.is(billingBasis(relayed, request(true), { seconds: 10, costPerSecond: 0.25 }).costMicros, 2_500_000);
    assert.is(billingBasis(relayed, request(true), { seconds: 10, costPerSecond: 0 }).costMicros, 0);
    assert.is(billingBasis(relayed, request(true), { seconds: 10, costPerSecond: 0.25 }).pricePerGpuSecondMicros, 250_000);
  }
});
it('the price is taken to the micro-unit and the charge rounded once, half up', () => {
  assert.is(toMicros(0.0000025), 3); // 2.5 micro-units: half up
  assert.is(toMicros(0.1 + 0.2), 300_000); // no float residue reaches the price
  assert.is(chargeMicros(0.5, 3), 2); // 1.5 -> 2
  assert.is(chargeMicros(0.25, 2), 1); // 0.5 -> 1
  assert.is(chargeMicros(0.2499, 2), 0);
  assert.is(chargeMicros(1.2345678, 1_000_000), 1_234_568);
  const billed = billingBasis(null, request(false), { seconds: 0.3333333, costPerSecond: 0.0123456789 });
  assert.equal([billed.pricePerGpuSecondMicros, billed.costMicros], [12_346, 4115]);
  assert.ok(Number.isInteger(billed.costMicros));
});
it.run();
