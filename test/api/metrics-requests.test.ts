/**
 * GET /metrics through real HTTP, the series that follow requests as they run: active and queued
 * requests, in all and per key (a key allowed one request at a time, the engine a listener that answers after a delay),
 * the store's append time per group commit, and the time the gateway added to each served completion
 * (the engine's own time left out).
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';
import { startFailingEngine, staticModel, type FailingEngine } from '../support/failing-engine.ts';
import { completeOnce, scrape, seriesValue } from '../support/metrics.ts';
import { until } from '../support/until.ts';

const it = suite('GET /metrics: requests, store appends, added latency');
let gw: TestGateway;
let engine: FailingEngine;

it.before(async () => {
  engine = await startFailingEngine('ok');
  const model = staticModel(engine.url);
  model.capabilities = { ...model.capabilities, max_inflight_per_key: 1, max_queued_per_key: 4 };
  gw = await startTestGateway({ models: [model] });
});
it.after(async () => {
  await gw?.stop();
  await engine?.close();
});

const complete = () => completeOnce(gw);
const metrics = () => scrape(gw);
const value = seriesValue;

it('active and queued requests follow a key\'s one slot: one running, one waiting, then none', async () => {
  let text = await metrics();
  assert.match(text, /# TYPE svc_requests_active gauge/);
  assert.is(value(text, 'svc_requests_active'), 0);
  assert.is(value(text, 'svc_requests_queued'), 0);
  engine.delayMs = 1_500;
  const both = Promise.all([complete(), complete()]);
  text = await until('one request running and one queued', async () => {
    const t = await metrics();
    return value(t, 'svc_requests_active') === 1 && value(t, 'svc_requests_queued') === 1 ? t : null;
  }, 10_000, 50);
  // The same, per key: the key's id (its public prefix) labels them.
  const keyId = gw.apiKey.split('_')[1];
  assert.is(value(text, `svc_key_requests_active{key_id="${keyId}"}`), 1, text);
  assert.is(value(text, `svc_key_requests_queued{key_id="${keyId}"}`), 1);
  assert.equal(await both, [200, 200]);
  engine.delayMs = 0;
  text = await until('no request running or queued once both settled', async () => {
    const t = await metrics();
    return value(t, 'svc_requests_active') === 0 && value(t, 'svc_requests_queued') === 0 ? t : null;
  }, 10_000, 50);
  // A key with nothing running or waiting has no series (the set of keys stays the active ones).
  assert.match(text, /# TYPE svc_key_requests_active gauge/);
  assert.not.match(text, /^svc_key_requests_(active|queued)\{/m);
});

it('store append time: one observation per group commit, more after a metered request', async () => {
  const before = value(await metrics(), 'svc_store_append_seconds_count');
  assert.ok(before !== null && before > 0, 'the key issued at start was appended');
  assert.is(await complete(), 200);
  await until('the request\'s reservation and settlement appended', async () => (value(await metrics(), 'svc_store_append_seconds_count') ?? 0) > before, 10_000, 50);
  const text = await metrics();
  assert.match(text, /# TYPE svc_store_append_seconds histogram/);
  assert.ok((value(text, 'svc_store_append_seconds_sum') ?? 0) > 0);
});

it('added latency: one observation per served completion, the engine\'s own time left out', async () => {
  let text = await metrics();
  const count = value(text, 'svc_added_latency_seconds_count{model="flaky"}') ?? 0;
  const sum = value(text, 'svc_added_latency_seconds_sum{model="flaky"}') ?? 0;
  assert.ok(count >= 3, 'the completions served before were observed');
  engine.delayMs = 3_000; // the engine's time: the request takes at least this long
  const started = performance.now();
  assert.is(await complete(), 200);
  const took = (performance.now() - started) / 1000;
  engine.delayMs = 0;
  text = await metrics();
  assert.is(value(text, 'svc_added_latency_seconds_count{model="flaky"}'), count + 1);
  const added = (value(text, 'svc_added_latency_seconds_sum{model="flaky"}') ?? 0) - sum;
  assert.ok(added >= 0 && added < took - 2.9, `added ${added} s of a ${took} s request whose engine took 3 s`);
  // Nothing served for a model that was not asked.
  assert.is(value(text, 'svc_added_latency_seconds_count{model="other"}'), null);
});

it.run();
