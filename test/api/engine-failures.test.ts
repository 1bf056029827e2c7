import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { loadSettings } from '../../src/config/index.ts';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';
import { assertDocumented } from '../support/openapi.ts';

// Every failure path of dispatch, on a real reference engine told to fail through its chaos route.
const failures = suite('engine failures through the gateway');
let gw: TestGateway;
// The default request window (14 minutes), for what a 2 s window would cut short on a busy machine; told
// nothing of ref-byte's context length or layer count, so that only its engine can judge them.
let patient: TestGateway;
let engineUrl: string;
let doc: any;

failures.before(async () => {
  const blind = loadSettings().models.map((m) =>
    m.id === 'ref-byte' ? { ...m, capabilities: { ...m.capabilities, max_model_len: null }, activations: { ...m.activations!, n_layers: null } } : m,
  );
  [gw, patient] = await Promise.all([startTestGateway({ requestWindowMs: 2_000 }, { chaosEngines: true }), startTestGateway({ models: blind }, { chaosEngines: true })]);
  engineUrl = gw.engineUrls.get('ref-byte')!;
  doc = await json(await fetch(`${gw.url}/openapi.json`));
});
failures.after(async () => {
  await Promise.all([gw?.stop(), patient?.stop()]);
});

async function chaos(mode: string, extra: Record<string, unknown> = {}) {
  const res = await fetch(`${engineUrl}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode, ...extra }) });
  assert.is(res.status, 200);
  await res.arrayBuffer();
}

function complete(body: Record<string, unknown> = {}) {
  return fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { ...gw.authHeaders(), 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'fail?', max_tokens: 4, temperature: 0, ...body }),
  });
}

function assertUpstreamError(res: Response, body: any, status: number, code: string) {
  assert.is(res.status, status);
  assert.is(body.error.code, code);
  assert.is(body.request_id, res.headers.get('x-request-id'));
  assert.is(res.headers.get('x-svc-upstream-error-kind'), code);
  assert.is(res.headers.get('x-svc-upstream-model'), 'svc/ref-byte-4l-64d-dummy');
  assert.is(res.headers.get('x-svc-upstream-gpu'), 'cpu-reference');
  assertDocumented(doc, 'POST', '/v1/completions', res);
}

failures('one transient 500 is retried and the client sees a success', async () => {
  await chaos('error500', { count: 1 });
  const res = await complete();
  assert.is(res.status, 200);
  assert.is((await json(res)).object, 'text_completion');
});

failures('a 500 that persists through the retries: 502 upstream_server_error with the upstream status', async () => {
  await chaos('error500', { count: 3 });
  const res = await complete();
  const body = await json(res);
  assertUpstreamError(res, body, 502, 'upstream_server_error');
  assert.is(body.error.upstream_status, 500);
  assert.ok(Number(res.headers.get('retry-after')) > 0);
});

failures('out of memory: 502 engine_oom, not retried', async () => {
  await chaos('oom', { count: 1 });
  const res = await complete();
  assertUpstreamError(res, await json(res), 502, 'engine_oom');
  assert.ok(res.headers.get('retry-after'));
  const next = await complete();
  assert.is(next.status, 200, 'the one failure was consumed by the one request');
  await next.arrayBuffer();
});

failures('dead engine: 502 engine_engine_dead', async () => {
  await chaos('dead');
  const res = await complete();
  assertUpstreamError(res, await json(res), 502, 'engine_engine_dead');
  await chaos('none');
});

failures('a generation still running when the window closes: 504 upstream_deadline, cancelled, no Retry-After', async () => {
  await chaos('hang', { count: 1 });
  const started = Date.now();
  const res = await complete();
  const body = await json(res);
  assertUpstreamError(res, body, 504, 'upstream_deadline');
  assert.is(res.headers.get('x-should-retry'), 'false');
  assert.is(res.headers.get('retry-after'), null);
  assert.ok(Date.now() - started >= 1_900, 'answered when the window closed');
  const next = await complete();
  assert.is(next.status, 200, 'the engine serves the next request');
  await next.arrayBuffer();
});

failures('an explicit max_tokens that cannot finish in the window: 400 deadline_infeasible', async () => {
  const res = await complete({ max_tokens: 38 });
  const body = await json(res);
  assert.is(res.status, 400);
  assert.is(body.error.code, 'deadline_infeasible');
  assert.is(res.headers.get('x-should-retry'), 'false');
  const ok = await complete({ max_tokens: 37 });
  assert.is(ok.status, 200);
  await ok.arrayBuffer();
  const streamed = await complete({ max_tokens: 38, stream: true });
  assert.is(streamed.status, 200, 'streams are not bound by the window');
  await streamed.arrayBuffer();
});

/** Resolves when exactly `count` generations run on the engine (its chaos route answers on the event, no polling). */
async function whenRunning(url: string, count: number): Promise<{ running: number; cancelled: number }> {
  // A safety net so a broken cancel fails the test instead of hanging it; the assertions are on the counts.
  const res = await fetch(`${url}/_chaos/running`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ count }), signal: AbortSignal.timeout(60_000) });
  assert.is(res.status, 200);
  return (await res.json()) as { running: number; cancelled: number };
}

failures('a client that disconnects cancels the upstream generation', async () => {
  // 150 ms a token: 30 s for 200 tokens if nobody cancels it. Non-streaming requests are cancelled by their
  // window too, so that case runs on a gateway whose window (the default 14 minutes) cannot close first.
  for (const [gateway, stream] of [[gw, true], [patient, false]] as const) {
    const engine = gateway.engineUrls.get('ref-byte')!;
    await fetch(`${engine}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: 'delay', delay_ms: 150, count: 1 }) }).then((r) => r.arrayBuffer());
    const client = new AbortController();
    const pending = fetch(`${gateway.url}/v1/completions`, {
      method: 'POST',
      headers: { ...gateway.authHeaders(), 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'cancel me', max_tokens: 200, temperature: 0, stream }),
      signal: client.signal,
    });
    if (stream) {
      const res = await pending;
      assert.is(res.status, 200);
      await res.body!.getReader().read();
    } else {
      pending.catch(() => undefined); // no byte comes back before the generation ends
    }
    const before = await whenRunning(engine, 1);
    client.abort();
    const after = await whenRunning(engine, 0);
    assert.is(after.cancelled, before.cancelled + 1, `the ${stream ? 'streaming' : 'non-streaming'} generation was cut short by its client leaving, not finished`);
  }
});

failures('a client that leaves a gzipped full-vocabulary body half-read cancels the generation', async () => {
  // Non-streaming, so on the default window: its first bytes may take over 2 s on a busy machine.
  const gpt2 = patient.engineUrls.get('ref-gpt2')!;
  const client = new AbortController();
  // ~300 positions x 50,257 entries: about a gigabyte of JSON, far more than is read here.
  const res = await fetch(`${patient.url}/v1/completions`, {
    method: 'POST',
    headers: { ...patient.authHeaders(), 'content-type': 'application/json', 'accept-encoding': 'gzip' },
    body: JSON.stringify({ model: 'ref-gpt2', prompt: 'the quick brown fox jumps over the lazy dog '.repeat(30), max_tokens: 1, prompt_logprobs: -1 }),
    signal: client.signal,
  });
  assert.is(res.status, 200);
  assert.is(res.headers.get('content-encoding'), 'gzip');
  const reader = res.body!.getReader();
  await reader.read();
  const before = await whenRunning(gpt2, 1);
  client.abort();
  const after = await whenRunning(gpt2, 0);
  assert.is(after.cancelled, before.cancelled + 1, 'the engine stopped writing the body because its client left');
});

failures('an engine that dies mid-stream: the stream ends with an error frame and [DONE], not torn', async () => {
  const gpt2 = gw.engineUrls.get('ref-gpt2')!;
  await fetch(`${gpt2}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: 'delay', delay_ms: 200, count: 1 }) }).then((r) => r.arrayBuffer());
  const res = await fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { ...gw.authHeaders(), 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'ref-gpt2', prompt: 'die', max_tokens: 20, temperature: 0, stream: true }),
  });
  assert.is(res.status, 200);
  const reader = res.body!.getReader();
  let text = Buffer.from((await reader.read()).value!).toString('utf8');
  assert.match(text, /^data: \{/, 'a first frame arrived');
  const restarted = gw.engineRestarted('ref-gpt2');
  process.kill(gw.enginePids.get('ref-gpt2')!, 'SIGKILL');
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    text += Buffer.from(value).toString('utf8');
  }
  const frames = text.split('\n\n').filter(Boolean);
  assert.is(frames[frames.length - 1], 'data: [DONE]');
  const error = JSON.parse(frames[frames.length - 2].slice('data: '.length));
  assert.is(error.error.code, 'upstream_unreachable');
  assert.type(error.request_id, 'string');
  await restarted;
});

failures('an engine that dies inside a frame: the torn frame is dropped, the client gets only whole frames', async () => {
  const gpt2 = gw.engineUrls.get('ref-gpt2')!;
  // `tear`: after the first token's frame the engine writes half of the next frame, then its process exits.
  await fetch(`${gpt2}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: 'tear' }) }).then((r) => r.arrayBuffer());
  const restarted = gw.engineRestarted('ref-gpt2');
  const res = await fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { ...gw.authHeaders(), 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'ref-gpt2', prompt: 'tear', max_tokens: 20, temperature: 0, stream: true }),
  });
  assert.is(res.status, 200);
  const text = await res.text();
  assert.ok(text.endsWith('\n\n'), 'the stream ends on a frame boundary');
  const frames = text.slice(0, -2).split('\n\n');
  for (const frame of frames) {
    assert.ok(frame.startsWith('data: '), `a whole frame: ${frame.slice(0, 80)}`);
    if (frame !== 'data: [DONE]') JSON.parse(frame.slice('data: '.length));
  }
  assert.is(frames.length, 3, 'the first token, the error, [DONE]');
  assert.is(JSON.parse(frames[0].slice(6)).object, 'text_completion');
  assert.is(JSON.parse(frames[1].slice(6)).error.code, 'upstream_unreachable');
  assert.is(frames[2], 'data: [DONE]');
  await restarted;
});

failures('a crashed engine: 502 upstream_unreachable after retries', async () => {
  await chaos('crash', { count: 1 });
  const restarted = gw.engineRestarted('ref-byte');
  const res = await complete();
  assertUpstreamError(res, await json(res), 502, 'upstream_unreachable');
  assert.ok(res.headers.get('retry-after'));
  // Down, its restart under way (src/platforms): `boot` is the restart's latest stage, the same engine's for activations.
  const down = await json(await fetch(`${gw.url}/v1/models/ref-byte/status`, { headers: gw.authHeaders() }));
  assert.ok(down.boot && down.boot.stage !== 'serving', `a restart's stage: ${JSON.stringify(down.boot)}`);
  assert.is(down.warm, false);
  assert.equal(down.activation_boot, down.boot);
  assert.ok(Date.now() - Date.parse(down.boot.at) < 60_000);
  // A request to the model while it is down is a request to a cold model: it waits out the boot (the
  // gateway starts the engine again after a backoff) and is served by the new engine, at its new address.
  // (Streamed: this gateway's 2 s request window for non-streaming requests is shorter than the backoff.)
  const next = await complete({ stream: true });
  assert.is(next.status, 200, 'served by the restarted engine');
  assert.match(await next.text(), /data: \[DONE\]/);
  const url = await restarted;
  assert.is(gw.engineUrls.get('ref-byte'), url);
  const health = await json(await fetch(`${gw.url}/v1/models/ref-byte/status`, { headers: gw.authHeaders() }));
  assert.is(health.warm, true);
  assert.is(health.activation_boot.stage, 'serving');
  assert.equal(health.activation_boot, health.boot);
});

failures('what only the engine can judge: its 400s map to engine_context_length and engine_invalid_request', async () => {
  // The gateway is told nothing of the model's context length or layer count, so the engine decides.
  const post = (body: Record<string, unknown>) =>
    fetch(`${patient.url}/v1/completions`, { method: 'POST', headers: { ...patient.authHeaders(), 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const tooLong = await post({ prompt: 'x'.repeat(1000), max_tokens: 32000, stream: true });
  const tooLongBody = await json(tooLong);
  assert.is(tooLong.status, 400);
  assert.is(tooLongBody.error.code, 'engine_context_length');
  assert.is(tooLongBody.error.upstream_status, 400);
  assert.is(tooLong.headers.get('x-svc-upstream-error-kind'), 'engine_context_length');

  const vector = Buffer.from(new Float32Array(64).fill(0.5).buffer).toString('base64');
  const badLayer = await post({ prompt: 'x', max_tokens: 1, apply_steering_vectors: [{ activations: { data: vector, dtype: 'float32', shape: [1, 64] }, layer_indices: [10] }] });
  const badLayerBody = await json(badLayer);
  assert.is(badLayer.status, 400);
  assert.is(badLayerBody.error.code, 'engine_invalid_request');
  assert.match(badLayerBody.error.message, /layer/);
  assert.is(badLayerBody.error.param, 'apply_steering_vectors[0].layer_indices', 'named as the client knows the field');
  assert.is(badLayer.headers.get('x-svc-upstream-model'), 'svc/ref-byte-4l-64d-dummy');
});

failures.run();
