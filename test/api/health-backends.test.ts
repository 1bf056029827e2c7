/**
 * GET /health's backends through real HTTP: the contract's whole body, with the breaker's fields,
 * the last completion and the warm estimate real, an open breaker listed in degraded_backends
 * (status degraded, still 200).
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';
import { startFailingEngine, staticModel, type FailingEngine } from '../support/failing-engine.ts';
import { assertDocumented } from '../support/openapi.ts';

const it = suite('GET /health: backends');
let gw: TestGateway;
let engine: FailingEngine;
let doc: any;

it.before(async () => {
  engine = await startFailingEngine('ok');
  gw = await startTestGateway({ models: [staticModel(engine.url), { ...staticModel(engine.url, 'steady'), default: false, status: 'staging' }], breaker: { failureThreshold: 2, cooldownMs: 60_000, probeLeaseMs: 10_000 } });
  doc = await json(await fetch(`${gw.url}/openapi.json`));
});
it.after(async () => {
  await gw?.stop();
  await engine?.close();
});

const complete = async (model: string) => {
  const res = await fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json' }, body: JSON.stringify({ model, prompt: 'hi', max_tokens: 1 }) });
  await res.arrayBuffer();
  return res.status;
};
const health = async () => {
  const res = await fetch(`${gw.url}/health`);
  const body = await json(res);
  assertDocumented(doc, 'GET', '/health', res);
  return { res, body, of: (id: string) => body.backends.find((b: { model_id: string }) => b.model_id === id) };
};

it('before any request: every backend closed, no completion yet', async () => {
  const { res, body, of } = await health();
  assert.is(res.status, 200);
  assert.is(body.status, 'ok');
  assert.equal(body.degraded_backends, []);
  assert.ok(body.wrapper.database.ok);
  assert.ok(Number.isInteger(body.wrapper.uptime_seconds));
  assert.equal(of('flaky'), {
    model_id: 'flaky',
    status: 'live',
    gpu_shape: 'test-gpu',
    breaker_state: 'closed',
    breaker_consecutive_failures: 0,
    breaker_last_failure_kind: null,
    last_completion_at: null,
    last_completion_seconds_ago: null,
    warm_estimate: of('flaky').warm_estimate,
  });
  assert.is(of('steady').status, 'staging');
});

it('a served completion sets last_completion_at, its age and the warm estimate', async () => {
  const before = Date.now();
  assert.is(await complete('flaky'), 200);
  const { of } = await health();
  const b = of('flaky');
  assert.ok(Date.parse(b.last_completion_at) >= before - 1000, b.last_completion_at);
  assert.ok(Number.isInteger(b.last_completion_seconds_ago) && b.last_completion_seconds_ago >= 0);
  assert.is(b.warm_estimate, 'warm');
  assert.is(of('steady').last_completion_at, null);
});

it('failures are counted with their kind; an open breaker is degraded (200) and listed', async () => {
  engine.mode = 'dead';
  assert.is(await complete('flaky'), 502);
  let { body, of } = await health();
  assert.is(of('flaky').breaker_consecutive_failures, 1);
  assert.is(of('flaky').breaker_last_failure_kind, 'engine_engine_dead');
  assert.is(body.status, 'ok');
  assert.is(await complete('flaky'), 502);
  const after = await health();
  ({ body, of } = after);
  assert.is(after.res.status, 200);
  assert.is(body.status, 'degraded');
  assert.equal(body.degraded_backends, ['flaky']);
  assert.is(of('flaky').breaker_state, 'open');
  assert.is(of('flaky').breaker_consecutive_failures, 2);
  assert.is(of('steady').breaker_state, 'closed', 'another model\'s backend is its own');
  engine.mode = 'ok';
  assert.is(await complete('steady'), 200, 'another model is still served');
});

it.run();
