import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { loadSettings } from '../../src/config/index.ts';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';

// Every failure path of dispatch, on a real reference engine told to fail through its chaos route.
const failures = suite('engine failures through the gateway');
let gw: TestGateway;
let engineUrl: string;

failures.before(async () => {
  gw = await startTestGateway({ requestWindowMs: 2_000 }, { chaosEngines: true });
  engineUrl = gw.engineUrls.get('ref-byte')!;
});
failures.after(async () => {
  await gw?.stop();
});

async function chaos(mode: string, extra: Record<string, unknown> = {}) {
  const res = await fetch(`${engineUrl}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode, ...extra }) });
  assert.is(res.status, 200);
  await res.arrayBuffer();
}

function complete(body: Record<string, unknown> = {}) {
  return fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
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

async function runningOnEngine(): Promise<number> {
  const text = await (await fetch(`${engineUrl}/metrics`)).text();
  return Number(text.match(/vllm:num_requests_running\{[^}]*\} (\d+)/)![1]);
}

failures('a client that disconnects cancels the upstream generation', async () => {
  // 150 ms a token for 200 tokens: 30 s if nobody cancels it (the window is 2 s, but streams ignore it and
  // the non-streaming request is cancelled by its client well before).
  await chaos('delay', { delay_ms: 150, count: 2 });
  for (const stream of [true, false]) {
    const client = new AbortController();
    const pending = fetch(`${gw.url}/v1/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      // Non-streaming requests must fit the 2 s window: 30 tokens (4.5 s at this pace) are accepted, and would
      // be cut by the deadline at 2 s; the client leaves long before that.
      body: JSON.stringify({ prompt: 'cancel me', max_tokens: stream ? 200 : 30, temperature: 0, stream }),
      signal: client.signal,
    });
    if (stream) {
      const res = await pending;
      assert.is(res.status, 200);
      await res.body!.getReader().read();
    } else {
      pending.catch(() => undefined);
      // no byte comes back before the generation ends; wait until the engine has started it
      while ((await runningOnEngine()) === 0) await new Promise((r) => setTimeout(r, 20));
    }
    assert.is(await runningOnEngine(), 1, 'the generation is running');
    client.abort();
    const deadline = Date.now() + (stream ? 5_000 : 800);
    while ((await runningOnEngine()) > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    assert.is(await runningOnEngine(), 0, `the ${stream ? 'streaming' : 'non-streaming'} generation stopped when the client left`);
  }
});

failures('a client that leaves a gzipped full-vocabulary body half-read cancels the generation', async () => {
  const gpt2 = gw.engineUrls.get('ref-gpt2')!;
  const running = async () => Number((await (await fetch(`${gpt2}/metrics`)).text()).match(/num_requests_running\{[^}]*\} (\d+)/)![1]);
  const client = new AbortController();
  // ~300 positions x 50,257 entries: about a gigabyte of JSON, far more than is read here.
  const res = await fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'accept-encoding': 'gzip' },
    body: JSON.stringify({ model: 'ref-gpt2', prompt: 'the quick brown fox jumps over the lazy dog '.repeat(30), max_tokens: 1, prompt_logprobs: -1 }),
    signal: client.signal,
  });
  assert.is(res.status, 200);
  assert.is(res.headers.get('content-encoding'), 'gzip');
  const reader = res.body!.getReader();
  await reader.read();
  assert.is(await running(), 1);
  client.abort();
  const deadline = Date.now() + 5_000;
  while ((await running()) > 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  assert.is(await running(), 0, 'the engine stopped writing the body');
});

failures('an engine that dies mid-stream: the stream ends with an error frame and [DONE], not torn', async () => {
  const gpt2 = gw.engineUrls.get('ref-gpt2')!;
  await fetch(`${gpt2}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: 'delay', delay_ms: 200, count: 1 }) }).then((r) => r.arrayBuffer());
  const res = await fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'ref-gpt2', prompt: 'die', max_tokens: 20, temperature: 0, stream: true }),
  });
  assert.is(res.status, 200);
  const reader = res.body!.getReader();
  let text = Buffer.from((await reader.read()).value!).toString('utf8');
  assert.match(text, /^data: \{/, 'a first frame arrived');
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
});

failures('a crashed engine: 502 upstream_unreachable after retries', async () => {
  await chaos('crash', { count: 1 });
  const res = await complete();
  assertUpstreamError(res, await json(res), 502, 'upstream_unreachable');
  assert.ok(res.headers.get('retry-after'));
  // The gateway starts the engine again (after a 1 s backoff) and points the model at its new address.
  const deadline = Date.now() + 20_000;
  let status = 0;
  while (Date.now() < deadline) {
    const next = await complete();
    status = next.status;
    await next.arrayBuffer();
    if (status === 200) break;
    await new Promise((r) => setTimeout(r, 250));
  }
  assert.is(status, 200, 'served again by the restarted engine');
  const health = await json(await fetch(`${gw.url}/v1/models/ref-byte/status`));
  assert.is(health.warm, true);
});

failures('what only the engine can judge: its 400s map to engine_context_length and engine_invalid_request', async () => {
  // The gateway is told nothing of the model's context length or layer count, so the engine decides.
  const models = loadSettings().models.map((m) =>
    m.id === 'ref-byte' ? { ...m, capabilities: { ...m.capabilities, max_model_len: null }, activations: { ...m.activations!, n_layers: null } } : m,
  );
  const blind = await startTestGateway({ models });
  try {
    const post = (body: Record<string, unknown>) =>
      fetch(`${blind.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
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
  } finally {
    await blind.stop();
  }
});

failures.run();
