/**
 * The circuit breaker through real HTTP: a model whose static engine URL points at a real listener
 * that fails as told. After N failures the breaker opens and the next request is refused (503
 * circuit_open, Retry-After) without the listener seeing it; once the cooldown is over one probe goes
 * through; its success closes the breaker, its failure opens it again. What counts: 5xx after retries,
 * out of memory, engine dead, unreachable; never a 4xx, never a client that left.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';
import { startFailingEngine, staticModel, type FailingEngine } from '../support/failing-engine.ts';
import { until } from '../support/until.ts';
import { assertDocumented } from '../support/openapi.ts';
import { meterEvents, meterStream, utcDay } from '../../events/meter.ts';
import { backendEvents, backendStream } from '../../events/backend.ts';

const it = suite('circuit breaker over HTTP');
const threshold = 3;
let gw: TestGateway;
let engine: FailingEngine;
let doc: any;

it.before(async () => {
  engine = await startFailingEngine('ok');
  // A short shutdown grace: a request whose client left (the last tests) holds the drain to its end (see the report of issue 28).
  // The request window and the cooldown are bounds a busy machine must not reach by accident: a request
  // slower than the window is a timeout (a failure), and a cooldown that lapses before the test reads the
  // breaker shows it half-open. Both are still short enough for the tests that wait them out.
  gw = await startTestGateway({ models: [staticModel(engine.url)], shutdownGraceMs: 1_000, requestWindowMs: 8_000, breaker: { failureThreshold: threshold, cooldownMs: 3_000, probeLeaseMs: 30_000 } });
  doc = await json(await fetch(`${gw.url}/openapi.json`));
});
it.after(async () => {
  await gw?.stop();
  await engine?.close();
});

const complete = (signal?: AbortSignal) =>
  fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'hi', max_tokens: 1 }), signal });

async function health(): Promise<any> {
  return json(await fetch(`${gw.url}/health`));
}
const breaker = async () => (await health()).backends.find((b: { model_id: string }) => b.model_id === 'flaky');

async function expectStatus(status: number, code?: string): Promise<Response> {
  const res = await complete();
  const body = await res.text();
  assert.is(res.status, status, body);
  if (code) assert.is(JSON.parse(body).error.code, code);
  return res;
}

/** Fails `threshold` requests in a row with the listener's current failing mode. */
async function openBreaker(status = 502): Promise<void> {
  for (let i = 0; i < threshold; i++) await expectStatus(status);
}

async function closeBreaker(): Promise<void> {
  engine.mode = 'ok';
  engine.delayMs = 0;
  await until('the breaker to close', async () => {
    const b = await breaker();
    if (b.breaker_state === 'closed' && b.breaker_consecutive_failures === 0) return true;
    if (b.breaker_state === 'half_open') await (await complete()).arrayBuffer();
    return false;
  });
}

async function eventsOf(stream: string) {
  return (await gw.store.readStream(stream)).events;
}

it('a healthy backend: successes append nothing to its stream', async () => {
  for (let i = 0; i < 3; i++) await expectStatus(200);
  assert.equal(await eventsOf(backendStream('flaky')), []);
  const b = await breaker();
  assert.is(b.breaker_state, 'closed');
  assert.is(b.breaker_consecutive_failures, 0);
  assert.is(b.breaker_last_failure_kind, null);
});

it('N failures open the breaker; the next request is 503 circuit_open with Retry-After, and the engine never sees it', async () => {
  engine.mode = '500';
  await openBreaker();
  const b = await breaker();
  assert.is(b.breaker_state, 'open');
  assert.is(b.breaker_consecutive_failures, threshold);
  assert.is(b.breaker_last_failure_kind, 'upstream_server_error');
  const h = await health();
  assert.is(h.status, 'degraded');
  assert.equal(h.degraded_backends, ['flaky']);

  const seen = engine.received;
  const res = await complete();
  const body = await json(res);
  assert.is(res.status, 503);
  assert.is(body.error.code, 'circuit_open');
  assert.ok(Number.isInteger(body.error.retry_after_seconds) && body.error.retry_after_seconds >= 1, JSON.stringify(body));
  assert.is(res.headers.get('retry-after'), String(body.error.retry_after_seconds));
  assert.is(res.headers.get('x-svc-upstream-error-kind'), 'circuit_open');
  assert.is(body.request_id, res.headers.get('x-request-id'));
  assertDocumented(doc, 'POST', '/v1/completions', res);
  assert.is(engine.received, seen, 'the engine was not contacted');

  // Metering: recorded as rejected (with its Retry-After), nothing held.
  const keyId = gw.apiKey.split('_')[1];
  const requestId = res.headers.get('x-request-id');
  const recordsOf = async () =>
    (await eventsOf(meterStream(keyId, utcDay(new Date())))).map((e) => meterEvents.parse(e)).filter((e) => 'request_id' in e.data && e.data.request_id === requestId);
  // The rejection is recorded alongside the answer, not before it.
  const mine = await until('the rejection to be recorded', async () => ((await recordsOf()).length > 0 ? recordsOf() : null));
  assert.is(mine.length, 1, JSON.stringify(mine));
  assert.is(mine[0].type, 'RequestRejected');
  const rejected = mine[0].data as { code: string; status: number; retry_after_seconds: number | null };
  assert.is(rejected.code, 'circuit_open');
  assert.is(rejected.status, 503);
  assert.is(rejected.retry_after_seconds, body.error.retry_after_seconds);

  const types = (await eventsOf(backendStream('flaky'))).map((e) => backendEvents.parse(e).type);
  assert.equal(types, ['BackendFailed', 'BackendFailed', 'BackendFailed', 'BreakerOpened']);
});

it('after the cooldown one probe goes through; its success closes the breaker', async () => {
  await until('the cooldown to end (half_open)', async () => (await breaker()).breaker_state === 'half_open');
  engine.mode = 'ok';
  const seen = engine.received;
  await expectStatus(200);
  assert.is(engine.received, seen + 1);
  const b = await breaker();
  assert.is(b.breaker_state, 'closed');
  assert.is(b.breaker_consecutive_failures, 0);
  assert.is((await health()).status, 'ok');
  const types = (await eventsOf(backendStream('flaky'))).map((e) => backendEvents.parse(e).type);
  assert.equal(types.slice(-3), ['BreakerHalfOpened', 'ProbeStarted', 'BreakerClosed']);
});

it('while one request probes, the others are refused without reaching the engine', async () => {
  engine.mode = '500';
  await openBreaker();
  await until('half_open', async () => (await breaker()).breaker_state === 'half_open');
  engine.mode = 'ok';
  engine.delayMs = 400;
  const seen = engine.received;
  const results = await Promise.all([complete(), complete(), complete()].map(async (p) => {
    const res = await p;
    return { status: res.status, body: await res.text() };
  }));
  assert.equal(results.map((r) => r.status).sort(), [200, 503, 503], JSON.stringify(results));
  assert.is(engine.received, seen + 1, 'exactly one probe reached the engine');
  engine.delayMs = 0;
  assert.is((await breaker()).breaker_state, 'closed');
});

it('a failed probe opens the breaker again', async () => {
  engine.mode = '500';
  await openBreaker();
  await until('half_open', async () => (await breaker()).breaker_state === 'half_open');
  const seen = engine.received;
  await expectStatus(502, 'upstream_server_error');
  assert.is(engine.received, seen + 3, 'the probe was retried as any request is');
  await expectStatus(503, 'circuit_open');
  assert.is(engine.received, seen + 3);
  const b = await breaker();
  assert.is(b.breaker_state, 'open');
  assert.is(b.breaker_consecutive_failures, threshold + 1);
  await closeBreaker();
});

it('out of memory, engine dead and unreachable each count, with their kinds', async () => {
  for (const [mode, kind] of [['oom', 'engine_oom'], ['dead', 'engine_engine_dead'], ['drop', 'upstream_unreachable']] as const) {
    engine.mode = mode;
    await openBreaker();
    const b = await breaker();
    assert.is(b.breaker_state, 'open', mode);
    assert.is(b.breaker_last_failure_kind, kind);
    await expectStatus(503, 'circuit_open');
    await closeBreaker();
  }
});

it('an engine that hangs past the request window counts as a timeout', async () => {
  engine.mode = 'ok';
  engine.delayMs = 120_000; // never within the 8 s window
  await openBreaker(504);
  const b = await breaker();
  assert.is(b.breaker_state, 'open');
  assert.is(b.breaker_last_failure_kind, 'timeout');
  await expectStatus(503, 'circuit_open');
  await closeBreaker();
});

it('a 4xx from the engine never counts: the breaker stays closed', async () => {
  engine.mode = '400';
  for (let i = 0; i < threshold + 2; i++) await expectStatus(400, 'engine_invalid_request');
  const b = await breaker();
  assert.is(b.breaker_state, 'closed');
  assert.is(b.breaker_consecutive_failures, 0);
});

it('a client that leaves never counts', async () => {
  engine.mode = 'ok';
  engine.delayMs = 2_000;
  const before = (await eventsOf(backendStream('flaky'))).length;
  for (let i = 0; i < threshold + 1; i++) {
    const controller = new AbortController();
    const pending = complete(controller.signal).catch(() => null);
    const seen = engine.received;
    await until('the request to reach the engine', async () => engine.received > seen);
    controller.abort();
    await pending;
  }
  engine.delayMs = 0;
  await expectStatus(200);
  assert.is((await eventsOf(backendStream('flaky'))).length, before, 'nothing was recorded');
  assert.is((await breaker()).breaker_state, 'closed');
});

it('a success after failures starts the count again (appended once)', async () => {
  engine.mode = '500';
  for (let i = 0; i < threshold - 1; i++) await expectStatus(502);
  assert.is((await breaker()).breaker_consecutive_failures, threshold - 1);
  engine.mode = 'ok';
  await expectStatus(200);
  await expectStatus(200);
  assert.is((await breaker()).breaker_consecutive_failures, 0);
  const types = (await eventsOf(backendStream('flaky'))).map((e) => backendEvents.parse(e).type);
  assert.equal(types.slice(-1), ['BackendFailuresCleared']);
  assert.is(types.filter((t) => t === 'BackendFailuresCleared').length, 1);
});

it.run();
