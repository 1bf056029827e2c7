import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { gunzipSync } from 'node:zlib';
import { request } from 'undici';
import SwaggerParser from '@apidevtools/swagger-parser';
import { loadSettings } from '../../src/config/index.ts';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';
import { assertDocumented } from '../support/openapi.ts';

const e2e = suite('completions end to end (gateway + reference engine over HTTP)');
let gw: TestGateway;
const byteCheckpoint = 'svc/ref-byte-4l-64d-dummy';

e2e.before(async () => {
  gw = await startTestGateway({}, { chaosEngines: true });
});
e2e.after(async () => {
  await gw?.stop();
});

function post(body: unknown, headers: Record<string, string> = {}) {
  return fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
}

async function sse(res: Response): Promise<{ frames: any[]; done: boolean }> {
  const text = await res.text();
  const events = text.split('\n\n').filter((e) => e.length > 0);
  const frames: any[] = [];
  let done = false;
  for (const event of events) {
    assert.ok(event.startsWith('data: '), `SSE event: ${event.slice(0, 80)}`);
    const data = event.slice(6);
    if (data === '[DONE]') done = true;
    else {
      assert.not.ok(done, 'nothing after [DONE]');
      frames.push(JSON.parse(data));
    }
  }
  return { frames, done };
}

e2e('non-streaming completion: text_completion passed through, model names the checkpoint, upstream headers', async () => {
  const res = await post({ prompt: 'Hello', max_tokens: 8, temperature: 0 });
  assert.is(res.status, 200);
  assert.is(res.headers.get('x-svc-upstream-model'), byteCheckpoint);
  assert.is(res.headers.get('x-svc-upstream-gpu'), 'cpu-reference');
  const body = await json(res);
  assert.is(body.object, 'text_completion');
  assert.is(body.model, byteCheckpoint);
  assert.match(body.id, /^cmpl-/);
  assert.is.not(body.id, res.headers.get('x-request-id'));
  assert.is(body.choices.length, 1);
  const choice = body.choices[0];
  assert.is(choice.index, 0);
  assert.type(choice.text, 'string');
  assert.ok(['stop', 'length'].includes(choice.finish_reason));
  assert.ok('stop_reason' in choice && 'logprobs' in choice);
  assert.is(choice.logprobs, null);
  assert.is(body.usage.prompt_tokens, 6, 'BOS + 5 bytes');
  assert.is(body.usage.total_tokens, body.usage.prompt_tokens + body.usage.completion_tokens);
  assert.ok(body.usage.completion_tokens <= 8);
  assertDocumented(await json(await fetch(`${gw.url}/openapi.json`)), 'POST', '/v1/completions', res);
});

e2e('greedy decoding is deterministic through the gateway', async () => {
  const a = await json(await post({ prompt: 'Determinism', max_tokens: 12, temperature: 0 }));
  const b = await json(await post({ prompt: 'Determinism', max_tokens: 12, temperature: 0 }));
  assert.is(a.choices[0].text, b.choices[0].text);
});

e2e('the model named explicitly, and the default model when null', async () => {
  const named = await json(await post({ model: 'ref-gpt2', prompt: 'The cat', max_tokens: 3, temperature: 0 }));
  assert.is(named.model, 'svc/ref-gpt2vocab-2l-64d-dummy');
  const byDefault = await json(await post({ model: null, prompt: 'The cat', max_tokens: 3, temperature: 0 }));
  assert.is(byDefault.model, byteCheckpoint);
});

e2e('batch with n: choices ordered prompt first, then fan-out index', async () => {
  const res = await post({ prompt: ['first prompt', 'second'], n: 3, max_tokens: 4, seed: 7, temperature: 1 });
  assert.is(res.status, 200);
  const body = await json(res);
  assert.is(body.choices.length, 6);
  body.choices.forEach((c: any, i: number) => assert.is(c.index, i));
  // prompt_tokens sums both prompts (BOS added to each)
  assert.is(body.usage.prompt_tokens, 13 + 7);
});

e2e('token-id prompts are forwarded verbatim and counted by ids', async () => {
  const single = await json(await post({ prompt: [72, 105, 33], max_tokens: 2, temperature: 0 }));
  assert.is(single.usage.prompt_tokens, 3);
  const batch = await json(await post({ prompt: [[72, 105], [33, 33, 33]], max_tokens: 2, temperature: 0 }));
  assert.is(batch.choices.length, 2);
  assert.is(batch.usage.prompt_tokens, 5);
});

e2e('echo prepends the prompt to the text', async () => {
  const body = await json(await post({ prompt: 'Echo me', max_tokens: 3, temperature: 0, echo: true }));
  assert.ok(body.choices[0].text.startsWith('Echo me'), body.choices[0].text);
});

e2e('logprobs 0: one-entry maps holding the sampled token', async () => {
  const body = await json(await post({ prompt: 'Log', max_tokens: 5, temperature: 0, logprobs: 0 }));
  const lp = body.choices[0].logprobs;
  assert.ok(lp.tokens.length >= 1);
  assert.is(lp.tokens.length, lp.token_logprobs.length);
  assert.is(lp.top_logprobs.length, lp.tokens.length);
  lp.top_logprobs.forEach((m: Record<string, number>, i: number) => {
    assert.is(Object.keys(m).length, 1);
    assert.ok(lp.tokens[i] in m);
  });
  assert.is(lp.text_offset.length, lp.tokens.length);
});

e2e('prompt_logprobs k: element 0 null, then maps with the prompt token and rank', async () => {
  const body = await json(await post({ prompt: 'abc', max_tokens: 1, temperature: 0, prompt_logprobs: 2 }));
  const pl = body.choices[0].prompt_logprobs;
  assert.is(pl.length, 4);
  assert.is(pl[0], null);
  for (const entry of pl.slice(1)) {
    const values = Object.values(entry) as any[];
    assert.ok(values.length >= 2 && values.length <= 3);
    for (const v of values) {
      assert.type(v.logprob, 'number');
      assert.ok(Number.isInteger(v.rank) && v.rank >= 1);
      assert.type(v.decoded_token, 'string');
    }
  }
});

e2e('full-vocabulary prompt logprobs: streamed, identical with and without gzip', async () => {
  const body = { prompt: 'full vocab', max_tokens: 1, temperature: 0, prompt_logprobs: -1 };
  const plain = await request(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json' }, body: JSON.stringify(body) });
  assert.is(plain.statusCode, 200);
  assert.is(plain.headers['content-encoding'], undefined);
  const plainText = await plain.body.text();
  const gz = await request(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json', 'accept-encoding': 'gzip' }, body: JSON.stringify(body) });
  assert.is(gz.statusCode, 200);
  assert.is(gz.headers['content-encoding'], 'gzip');
  assert.match(String(gz.headers.vary), /Accept-Encoding/i);
  const gzBytes = Buffer.from(await gz.body.arrayBuffer());
  const unzipped = gunzipSync(gzBytes).toString('utf8');
  assert.ok(gzBytes.length < unzipped.length / 2, 'compressed');
  const a = JSON.parse(plainText);
  const b = JSON.parse(unzipped);
  assert.equal(a.choices[0].prompt_logprobs, b.choices[0].prompt_logprobs);
  const positions = a.choices[0].prompt_logprobs;
  assert.is(positions[0], null);
  for (const entry of positions.slice(1)) {
    const values = Object.values(entry) as any[];
    assert.is(values.length, 258, 'the whole byte vocabulary');
    const mass = values.reduce((s, v) => s + Math.exp(v.logprob), 0);
    assert.ok(Math.abs(mass - 1) < 1e-4, `probabilities sum to ${mass}`);
  }
});

e2e('gzip: with Accept-Encoding: gzip every non-streaming body is compressed, small ones, errors and other routes too', async () => {
  const gzipHeaders = { ...gw.authHeaders(), 'content-type': 'application/json', 'accept-encoding': 'gzip' };
  for (const body of [{ prompt: 'zip', max_tokens: 40, temperature: 0, logprobs: 5 }, { prompt: 'z', max_tokens: 1, temperature: 0 }]) {
    const res = await request(`${gw.url}/v1/completions`, { method: 'POST', headers: gzipHeaders, body: JSON.stringify(body) });
    assert.is(res.statusCode, 200);
    assert.is(res.headers['content-encoding'], 'gzip');
    assert.match(String(res.headers.vary), /accept-encoding/i);
    const zipped = Buffer.from(await res.body.arrayBuffer());
    assert.is(Number(res.headers['content-length']), zipped.length);
    assert.is(JSON.parse(gunzipSync(zipped).toString('utf8')).object, 'text_completion');
  }
  const error = await request(`${gw.url}/v1/completions`, { method: 'POST', headers: gzipHeaders, body: JSON.stringify({ prompt: 'z', max_tokens: -1 }) });
  assert.is(error.statusCode, 400);
  assert.is(error.headers['content-encoding'], 'gzip');
  assert.is(JSON.parse(gunzipSync(Buffer.from(await error.body.arrayBuffer())).toString('utf8')).error.code, 'invalid_request');
  for (const path of ['/v1/models', '/openapi.json', '/health']) {
    const res = await request(`${gw.url}${path}`, { headers: gzipHeaders });
    assert.is(res.statusCode, 200, path);
    assert.is(res.headers['content-encoding'], 'gzip', path);
    assert.type(JSON.parse(gunzipSync(Buffer.from(await res.body.arrayBuffer())).toString('utf8')), 'object');
  }
  // Without it, nothing is compressed.
  const plain = await request(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'z', max_tokens: 1, temperature: 0 }) });
  assert.is(plain.headers['content-encoding'], undefined);
  assert.is(JSON.parse(await plain.body.text()).object, 'text_completion');
});

e2e('seed: 2^63-1 is accepted and 2^63 refused, though JSON.parse reads both as one double', async () => {
  const raw = (seed: string) =>
    fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json' }, body: `{"prompt":"a","max_tokens":1,"seed":${seed}}` });
  const largest = await raw('9223372036854775807');
  assert.is(largest.status, 200);
  await largest.arrayBuffer();
  for (const seed of ['9223372036854775808', '9223372036854776808']) {
    const over = await raw(seed);
    assert.is(over.status, 400, seed);
    const body = await json(over);
    assert.is(body.error.code, 'invalid_request');
    assert.match(body.error.message, /^seed: /);
  }
});

e2e('streaming without include_usage: one frame per token, no usage frame, [DONE], text equals non-streaming', async () => {
  const res = await post({ prompt: 'Stream', max_tokens: 10, temperature: 0, stream: true }, { 'accept-encoding': 'gzip' });
  assert.is(res.status, 200);
  assert.match(res.headers.get('content-type') ?? '', /text\/event-stream/);
  assert.is(res.headers.get('content-encoding'), null, 'SSE is never compressed');
  assert.is(res.headers.get('x-svc-upstream-model'), byteCheckpoint);
  const { frames, done } = await sse(res);
  assert.ok(done);
  assert.ok(frames.length >= 1);
  for (const f of frames) {
    assert.ok(f.choices.length > 0);
    assert.not.ok(f.usage, 'no usage without include_usage / continuous_usage_stats');
  }
  const last = frames[frames.length - 1];
  assert.ok(['stop', 'length'].includes(last.choices[0].finish_reason));
  frames.slice(0, -1).forEach((f) => assert.is(f.choices[0].finish_reason, null));
  const text = frames.map((f) => f.choices[0].text).join('');
  const whole = await json(await post({ prompt: 'Stream', max_tokens: 10, temperature: 0 }));
  assert.is(text, whole.choices[0].text);
});

e2e('streaming is streamed: the first frame reaches the client while the engine is still generating', async () => {
  const engine = gw.engineUrls.get('ref-byte')!;
  const running = async () => Number((await (await fetch(`${engine}/metrics`)).text()).match(/num_requests_running\{[^}]*\} (\d+)/)![1]);
  // The engine holds its generation for 30 s after the first token: a relay that buffered the body
  // would have nothing to show the client before then.
  await (await fetch(`${engine}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: 'delay', delay_ms: 30_000, count: 1 }) })).arrayBuffer();
  const client = new AbortController();
  const res = await fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { ...gw.authHeaders(), 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'Incremental', max_tokens: 3, temperature: 0, stream: true }),
    signal: client.signal,
  });
  assert.is(res.status, 200);
  const reader = res.body!.getReader();
  const first = Buffer.from((await reader.read()).value!).toString('utf8');
  assert.match(first, /^data: \{/);
  assert.is(JSON.parse(first.slice(6).split('\n\n')[0]).choices.length, 1, 'a whole content frame');
  assert.is(await running(), 1, 'the engine has not finished the generation');
  client.abort();
});

e2e('streaming with include_usage: final usage frame with empty choices before [DONE]', async () => {
  const { frames, done } = await sse(await post({ prompt: 'Usage', max_tokens: 6, temperature: 0, stream: true, stream_options: { include_usage: true } }));
  assert.ok(done);
  const last = frames[frames.length - 1];
  assert.equal(last.choices, []);
  assert.is(last.usage.prompt_tokens, 6);
  assert.is(last.usage.total_tokens, last.usage.prompt_tokens + last.usage.completion_tokens);
  frames.slice(0, -1).forEach((f) => assert.ok(f.choices.length > 0));
});

e2e('streaming with continuous_usage_stats: every content frame carries a running usage', async () => {
  const { frames } = await sse(await post({ prompt: 'Usage', max_tokens: 6, temperature: 0, stream: true, stream_options: { include_usage: true, continuous_usage_stats: true } }));
  const content = frames.filter((f) => f.choices.length > 0);
  assert.ok(content.length >= 1);
  let previous = 0;
  for (const f of content) {
    assert.type(f.usage, 'object');
    assert.ok(f.usage.completion_tokens >= previous);
    previous = f.usage.completion_tokens;
  }
});

e2e('capture: residual stream of every layer, then of a deduplicated sorted subset', async () => {
  const all = await json(await post({ prompt: 'Capture', max_tokens: 3, temperature: 0, output_residual_stream: true }));
  const rs = all.activations.residual_stream;
  const generated = all.usage.completion_tokens;
  assert.equal(rs.shape, [4, 8 + generated - 1, 64]);
  assert.is(rs.original_dtype, 'torch.bfloat16');
  const some = await json(await post({ prompt: 'Capture', max_tokens: 3, temperature: 0, output_residual_stream: [3, 1, 3] }));
  assert.is(some.activations.residual_stream.shape[0], 2);
  assert.is(some.choices[0].text, all.choices[0].text);
});

e2e("capture: the largest body /v1/models states bounds a real one, a prompt of GPT-2's longest token in JSON echoed", async () => {
  const models = await json(await fetch(`${gw.url}/v1/models`, { headers: gw.authHeaders() }));
  const bound = models.data.find((m: { id: string }) => m.id === 'ref-gpt2').capabilities.max_capture_bytes;
  // Token 35496 is 128 bytes of JSON text; 2,047 of them and one generated token fill max_model_len.
  const res = await post({ model: 'ref-gpt2', prompt: new Array(2047).fill(35496), max_tokens: 1, echo: true, temperature: 0, output_residual_stream: true });
  assert.is(res.status, 200);
  const body = Buffer.from(await res.arrayBuffer());
  assert.ok(body.length <= bound, `${body.length} bytes against the stated ${bound}`);
  assert.ok(body.length > 2048 * (4 * Math.ceil((2 * 64 * 2) / 3) + 64) + 65_536, `${body.length} bytes: more than 64 bytes of JSON per position`);
});

e2e('steering changes the next-token distribution', async () => {
  const vector = new Float32Array(64).map((_, i) => (i % 2 === 0 ? 1 : -1));
  const steering = [{ activations: { data: Buffer.from(vector.buffer).toString('base64'), dtype: 'float32', shape: [1, 64] }, layer_indices: [1], scale: 8 }];
  const plain = await json(await post({ prompt: 'Steer', max_tokens: 1, temperature: 0, logprobs: 5 }));
  const steered = await json(await post({ prompt: 'Steer', max_tokens: 1, temperature: 0, logprobs: 5, apply_steering_vectors: steering }));
  assert.is.not(JSON.stringify(steered.choices[0].logprobs.top_logprobs), JSON.stringify(plain.choices[0].logprobs.top_logprobs));
  // A batch with n = 2: every choice of every prompt is steered, as the single one was.
  const batch = await json(await post({ prompt: ['Steer', 'Steer'], n: 2, max_tokens: 1, temperature: 0, logprobs: 5, apply_steering_vectors: steering }));
  assert.is(batch.choices.length, 4);
  for (const choice of batch.choices) assert.is(JSON.stringify(choice.logprobs.top_logprobs), JSON.stringify(steered.choices[0].logprobs.top_logprobs));
});

e2e('omitted max_tokens on a non-streaming request is cut to the deadline and reported', async () => {
  // ref-byte only: ref-gpt2's engine would start for nothing.
  const short = await startTestGateway({ models: loadSettings().models.filter((m) => m.id === 'ref-byte'), requestWindowMs: 14_000 });
  try {
    const res = await fetch(`${short.url}/v1/completions`, { method: 'POST', headers: { ...short.authHeaders(), 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'Clamp', temperature: 0 }) });
    assert.is(res.status, 200);
    assert.is(res.headers.get('x-svc-max-tokens-clamped'), 'requested=32000,applied=260,reason=deadline,source=default');
    const body = await json(res);
    assert.ok(body.usage.completion_tokens <= 260);
    const streamed = await fetch(`${short.url}/v1/completions`, { method: 'POST', headers: { ...short.authHeaders(), 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'Clamp', temperature: 0, stream: true, max_tokens: null }) });
    assert.is(streamed.headers.get('x-svc-max-tokens-clamped'), null, 'streaming keeps the full default');
    await streamed.body?.cancel();
  } finally {
    await short.stop();
  }
});

e2e('validation errors come back in the envelope before any engine is called', async () => {
  const res = await post({ prompt: 'x', extra_body: {} });
  assert.is(res.status, 400);
  const body = await json(res);
  assert.is(body.error.code, 'invalid_request');
  assert.match(body.error.message, /extra_body/);
  assert.is(body.request_id, res.headers.get('x-request-id'));
  assert.is(res.headers.get('x-svc-upstream-model'), null);
  assertDocumented(await json(await fetch(`${gw.url}/openapi.json`)), 'POST', '/v1/completions', res);
});

e2e('GET /v1/models lists live models with capabilities', async () => {
  const res = await fetch(`${gw.url}/v1/models`, { headers: gw.authHeaders() });
  assert.is(res.status, 200);
  const body = await json(res);
  assert.is(body.object, 'list');
  const ids = body.data.map((m: any) => m.id);
  assert.equal(ids, ['ref-byte', 'ref-gpt2']);
  const byte = body.data[0];
  assert.is(byte.default, true);
  assert.is(body.data[1].default, false);
  const caps = byte.capabilities;
  assert.is(caps.max_model_len, 32768);
  assert.is(caps.chat_template, null);
  assert.is(caps.logprobs, true);
  assert.is(caps.prompt_logprobs, true);
  assert.is(caps.full_vocab_max_prompt_tokens, 1024);
  assert.is(caps.max_output_work_tokens, 32000);
  assert.is(caps.activations, true);
  assert.is(caps.n_layers, 4);
  assert.is(caps.max_steering_vectors, 8);
  assert.is(caps.d_model, 64);
  // 1 layer x 32,768 positions x 64 wide, as base64 bf16, plus 64 KiB + 64 B per position of JSON.
  assert.is(caps.max_capture_bytes, 4 * Math.ceil((32_768 * 64 * 2) / 3) + 65_536 + 32_768 * 64);
});

e2e('GET /v1/models/{id}/status: boot and warm; 400 for a malformed id', async () => {
  const res = await fetch(`${gw.url}/v1/models/ref-byte/status`, { headers: gw.authHeaders() });
  assert.is(res.status, 200);
  const body = await json(res);
  assert.ok('boot' in body && 'warm' in body && 'activation_boot' in body);
  assert.is(body.activation_boot.stage, 'serving', 'a stage value, never null (engines start warm in these tests)');
  for (const id of [encodeURIComponent('bad id!'), 'x'.repeat(65), 'y'.repeat(300)]) {
    const bad = await fetch(`${gw.url}/v1/models/${id}/status`, { headers: gw.authHeaders() });
    assert.is(bad.status, 400, id);
    const body = await json(bad);
    assert.is(body.error.code, 'invalid_request');
    assert.is(body.request_id, bad.headers.get('x-request-id'));
  }
  const unknown = await fetch(`${gw.url}/v1/models/no-such-model/status`, { headers: gw.authHeaders() });
  assert.is(unknown.status, 400);
  const doc = await json(await fetch(`${gw.url}/openapi.json`));
  assertDocumented(doc, 'GET', '/v1/models/{model_id}/status', res);
  assertDocumented(doc, 'GET', '/v1/models/{model_id}/status', unknown);
  assert.is((await json(unknown)).error.code, 'model_not_found');
});

e2e('/openapi.json is version 0.1.0 with only /v1 routes and /health; /swagger serves a UI', async () => {
  const doc = await json(await fetch(`${gw.url}/openapi.json`));
  assert.is(doc.info.version, '0.1.0');
  assert.match(doc.openapi, /^3\.1\./, 'TypeBox emits JSON Schema 2020-12 keywords (type null, const): OpenAPI 3.1');
  await SwaggerParser.validate(structuredClone(doc));
  for (const path of Object.keys(doc.paths)) assert.ok(path === '/health' || path.startsWith('/v1/'), path);
  const completions = doc.paths['/v1/completions'].post;
  for (const status of ['400', '401', '413', '429', '502', '503', '504']) {
    assert.ok(completions.responses[status], status);
    assert.ok(completions.responses[status].headers['Retry-After']);
    assert.ok(completions.responses[status].headers['X-Should-Retry']);
  }
  assert.ok(doc.paths['/v1/models/{model_id}/status'].get.responses['422']);
  const ui = await fetch(`${gw.url}/swagger`, { redirect: 'follow' });
  assert.is(ui.status, 200);
  const html = await ui.text();
  assert.match(html, /swagger/i);
  // The UI works offline: its scripts and its initializer (pointing at our document) come from the gateway.
  for (const asset of ['swagger-ui-bundle.js', 'swagger-ui-standalone-preset.js', 'swagger-initializer.js']) {
    const res = await fetch(`${gw.url}/swagger/static/${asset}`);
    assert.is(res.status, 200, asset);
    const text = await res.text();
    if (asset === 'swagger-initializer.js') assert.match(text, /openapi\.json/);
  }
});

e2e.run();
