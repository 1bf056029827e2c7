/**
 * GET /metrics through real HTTP: Prometheus text, behind the admin token; requests counted by route,
 * model and status; the breaker's state and failures per backend; projection lag.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';
import { startFailingEngine, staticModel, type FailingEngine } from '../support/failing-engine.ts';
import { completeOnce, scrape, seriesValue } from '../support/metrics.ts';

const it = suite('GET /metrics');
let gw: TestGateway;
let engine: FailingEngine;

it.before(async () => {
  engine = await startFailingEngine('ok');
  gw = await startTestGateway({ models: [staticModel(engine.url)], breaker: { failureThreshold: 2, cooldownMs: 60_000, probeLeaseMs: 10_000 } });
});
it.after(async () => {
  await gw?.stop();
  await engine?.close();
});

const complete = () => completeOnce(gw);
const metrics = () => scrape(gw);
const value = seriesValue;

it('refused without the admin token, and with an API key', async () => {
  assert.is((await fetch(`${gw.url}/metrics`)).status, 401);
  const res = await fetch(`${gw.url}/metrics`, { headers: gw.authHeaders() });
  assert.is(res.status, 401);
  assert.is(((await res.json()) as { error: { code: string } }).error.code, 'invalid_api_key');
});

it('requests by route, model and status, and their durations', async () => {
  assert.is(await complete(), 200);
  assert.is(await complete(), 200);
  const text = await metrics();
  assert.is(value(text, 'svc_http_requests_total{route="/v1/completions",model="flaky",status="200"}'), 2);
  assert.is(value(text, 'svc_http_request_duration_seconds_count{route="/v1/completions"}'), 2);
  assert.match(text, /# TYPE svc_http_request_duration_seconds histogram/);
});

it('the breaker per backend: state and failures in a row, following the breaker', async () => {
  let text = await metrics();
  assert.is(value(text, 'svc_backend_breaker_state{model="flaky",backend="completion",state="closed"}'), 1);
  assert.is(value(text, 'svc_backend_breaker_state{model="flaky",backend="completion",state="open"}'), 0);
  assert.is(value(text, 'svc_backend_consecutive_failures{model="flaky",backend="completion"}'), 0);
  engine.mode = 'oom';
  assert.is(await complete(), 502);
  text = await metrics();
  assert.is(value(text, 'svc_backend_consecutive_failures{model="flaky",backend="completion"}'), 1);
  assert.is(await complete(), 502);
  assert.is(await complete(), 503);
  text = await metrics();
  assert.is(value(text, 'svc_backend_breaker_state{model="flaky",backend="completion",state="open"}'), 1);
  assert.is(value(text, 'svc_backend_consecutive_failures{model="flaky",backend="completion"}'), 2);
  assert.is(value(text, 'svc_http_requests_total{route="/v1/completions",model="flaky",status="503"}'), 1);
});

it('boot stages per backend, once one is published', async () => {
  await gw.backends.publishBootStage('flaky', 'completion', 'serving');
  const text = await metrics();
  assert.is(value(text, 'svc_backend_boot_stage{model="flaky",backend="completion",stage="serving"}'), 1);
  assert.is(value(text, 'svc_backend_boot_stage{model="flaky",backend="completion",stage="failed"}'), 0);
});

it('projection lag per projection', async () => {
  await gw.projectionsCaughtUp();
  const text = await metrics();
  const lag = value(text, 'svc_projection_lag_events{projection="backend_health"}');
  assert.ok(lag !== null && lag >= 0, text);
});

it.run();
