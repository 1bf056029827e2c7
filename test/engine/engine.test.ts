// The reference engine over real HTTP (in-process, port 0): sampling, logprobs, streaming, stop/EOS, capture, steering.
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startReferenceEngine } from '../../src/reference-engine/index.ts';
import { decodeTensor, encodeTensor, encodeTensorZstd } from '../../src/codec/index.ts';
import { configuredModel, post, postStream } from './helpers.ts';

const model = configuredModel('ref-byte');
const D = model.architecture!.d_model;
const L = model.architecture!.n_layers;
const ctx: { url: string; close(): Promise<void> } = { url: '', close: async () => {} };
const test = suite('reference engine (ref-byte)');
test.before(async () => {
  Object.assign(ctx, await startReferenceEngine(model));
});
test.after(() => ctx.close());
const completions = (body: unknown) => post(`${ctx.url}/v1/completions`, body);
const base = { prompt: 'The quick brown fox', top_p: 1, top_k: -1, min_p: 0, presence_penalty: 0, frequency_penalty: 0, repetition_penalty: 1 };

test('models, health, tokenize and detokenize', async () => {
  const models = (await (await fetch(`${ctx.url}/v1/models`)).json()) as any;
  assert.is(models.object, 'list');
  assert.is(models.data[0].id, model.checkpoint);
  assert.is(models.data[0].max_model_len, 32768);
  assert.is((await fetch(`${ctx.url}/health`)).status, 200);
  const tok = await post(`${ctx.url}/tokenize`, { prompt: 'hi', add_special_tokens: true });
  assert.equal(tok.json, { count: 3, max_model_len: 32768, tokens: [256, 104, 105], token_strs: null });
  const empty = await post(`${ctx.url}/tokenize`, { prompt: '' });
  assert.equal(empty.json.tokens, [256]);
  const det = await post(`${ctx.url}/detokenize`, { tokens: [104, 105] });
  assert.equal(det.json, { prompt: 'hi' });
  const wrong = await post(`${ctx.url}/tokenize`, { prompt: 'hi', model: 'nope' });
  assert.is(wrong.status, 404);
  assert.is(wrong.json.error.code, 404);
});

test('response shape, usage, unknown fields ignored, model name checked', async () => {
  const r = await completions({ ...base, model: model.checkpoint, max_tokens: 5, temperature: 0, some_unknown_field: 1 });
  assert.is(r.status, 200);
  assert.match(r.json.id, /^cmpl-[0-9a-f]+$/);
  assert.is(r.json.object, 'text_completion');
  assert.is(r.json.model, model.checkpoint);
  assert.type(r.json.created, 'number');
  const c = r.json.choices[0];
  assert.equal(Object.keys(c), ['index', 'text', 'logprobs', 'finish_reason', 'stop_reason', 'prompt_logprobs']);
  assert.is(c.logprobs, null);
  assert.is(c.prompt_logprobs, null);
  assert.is(c.finish_reason, 'length');
  assert.equal(r.json.usage, { prompt_tokens: 20, total_tokens: 25, completion_tokens: 5 });
  const other = await completions({ ...base, model: 'other/model', max_tokens: 5 });
  assert.is(other.status, 404);
  assert.is(other.json.error.type, 'NotFoundError');
});

test('validation errors use vLLM shape with param', async () => {
  const cases: [unknown, string | null][] = [
    [{ ...base, temperature: -1 }, 'temperature'],
    [{ ...base, top_p: 0 }, 'top_p'],
    [{ ...base, logprobs: 101 }, 'logprobs'],
    [{ ...base, prompt_logprobs: 1, stream: true }, 'prompt_logprobs'],
    [{ ...base, stream_options: { include_usage: true } }, 'stream_options'],
    [{ ...base, prompt: [] }, 'prompt'],
    [{ ...base, prompt: [1, 'a'] }, 'prompt'],
    [{ ...base, prompt_logprobs: -1, stream: true }, 'prompt_logprobs'],
    // vLLM raises these as plain ValueErrors without a param: a gateway must not read them as context-limit errors.
    [{ ...base, prompt: [999] }, null],
    [{ ...base, prompt: '', add_special_tokens: false }, null],
    [{ ...base, max_tokens: 40000 }, 'max_tokens'],
    [{ ...base, vllm_xargs: { output_residual_stream: '[4]' } }, 'vllm_xargs.output_residual_stream'],
  ];
  for (const [body, param] of cases) {
    const r = await completions(body);
    assert.is(r.status, 400, JSON.stringify(body));
    assert.is(r.json.error.type, 'BadRequestError');
    assert.is(r.json.error.code, 400);
    assert.is(r.json.error.param, param, JSON.stringify(body));
    assert.type(r.json.error.message, 'string');
  }
  const bad = await fetch(`${ctx.url}/v1/completions`, { method: 'POST', body: '{not json' });
  assert.is(bad.status, 400);
});

test('greedy equals argmax of the logprobs, and top_k 1 equals greedy', async () => {
  const greedy = await completions({ ...base, max_tokens: 24, temperature: 0, logprobs: 1 });
  const lp = greedy.json.choices[0].logprobs;
  lp.token_logprobs.forEach((v: number, i: number) => {
    const best = Math.max(...(Object.values(lp.top_logprobs[i]) as number[]));
    assert.is(v, best, `position ${i}`);
  });
  const k1 = await completions({ ...base, max_tokens: 24, temperature: 1, top_k: 1, seed: 5 });
  assert.is(k1.json.choices[0].text, greedy.json.choices[0].text);
});

test('a fixed seed reproduces text and logprobs; choice i uses seed + i', async () => {
  const body = { ...base, max_tokens: 40, temperature: 1, seed: 1234, logprobs: 3, n: 2 };
  const a = await completions(body);
  const b = await completions(body);
  assert.equal(a.json.choices, b.json.choices);
  assert.is.not(a.json.choices[0].text, a.json.choices[1].text);
  const shifted = await completions({ ...body, seed: 1235, n: 1 });
  assert.equal(shifted.json.choices[0].text, a.json.choices[1].text);
  for (const m of a.json.choices[0].logprobs.top_logprobs) assert.ok(Object.keys(m).length >= 3 && Object.keys(m).length <= 4);
});

test('batch prompts, n, echo and choice order prompt_idx * n + i', async () => {
  const r = await completions({ ...base, prompt: ['ab', 'cd'], n: 2, max_tokens: 3, temperature: 0, echo: true });
  assert.equal(r.json.choices.map((c: any) => c.index), [0, 1, 2, 3]);
  assert.ok(r.json.choices[0].text.startsWith('ab'));
  assert.ok(r.json.choices[2].text.startsWith('cd'));
  assert.equal(r.json.usage, { prompt_tokens: 6, total_tokens: 18, completion_tokens: 12 });
  const ids = await completions({ ...base, prompt: [[104, 105], [106]], max_tokens: 2, temperature: 0 });
  assert.is(ids.json.usage.prompt_tokens, 3);
});

test('full-vocabulary prompt logprobs sum to 1 and ranks agree with values', async () => {
  const r = await completions({ ...base, prompt: 'Hello, world', max_tokens: 1, prompt_logprobs: -1 });
  const pl = r.json.choices[0].prompt_logprobs;
  assert.is(pl.length, 13);
  assert.is(pl[0], null);
  const prompt = [256, ...Buffer.from('Hello, world')];
  for (let j = 1; j < pl.length; j++) {
    const entries = Object.entries(pl[j]) as [string, { logprob: number; rank: number; decoded_token: string }][];
    assert.is(entries.length, 258);
    assert.ok(pl[j][String(prompt[j])], 'the actual prompt token is present');
    const sum = entries.reduce((s, [, e]) => s + Math.exp(e.logprob), 0);
    assert.ok(Math.abs(sum - 1) < 1e-4, `position ${j} sums to ${sum}`);
    const byRank = entries.map(([, e]) => e).sort((a, b) => a.rank - b.rank);
    byRank.forEach((e, i) => {
      assert.is(e.rank, i + 1);
      if (i > 0) assert.ok(e.logprob <= byRank[i - 1].logprob);
    });
  }
  const top100 = await completions({ ...base, prompt: 'Hello there, '.repeat(25), max_tokens: 1, prompt_logprobs: 100 });
  for (const e of top100.json.choices[0].prompt_logprobs.slice(1)) assert.ok([100, 101].includes(Object.keys(e).length));
  const top2 = await completions({ ...base, prompt: 'Hello', max_tokens: 1, prompt_logprobs: 2 });
  for (const e of top2.json.choices[0].prompt_logprobs.slice(1)) assert.ok(Object.keys(e).length === 2 || Object.keys(e).length === 3);
});

test('stop strings end the text before the match; EOS gives stop with a null stop_reason', async () => {
  const free = await completions({ ...base, max_tokens: 60, temperature: 0 });
  const text: string = free.json.choices[0].text;
  const stop = text.slice(20, 23);
  const cut = text.indexOf(stop);
  const stopped = await completions({ ...base, max_tokens: 60, temperature: 0, stop: ['zzzzzz', stop] });
  const c = stopped.json.choices[0];
  assert.is(c.text, text.slice(0, cut));
  assert.is(c.finish_reason, 'stop');
  assert.is(c.stop_reason, stop);
  const eos = await completions({ ...base, max_tokens: 3000, temperature: 1, seed: 7, n: 6, logprobs: 0 });
  const ended = eos.json.choices.filter((x: any) => x.finish_reason === 'stop');
  assert.ok(ended.length > 0, 'some sampled generations end with EOS');
  for (const x of ended) {
    assert.is(x.stop_reason, null);
    assert.is(x.logprobs.tokens[x.logprobs.tokens.length - 1], '<|eos|>');
    assert.not.ok(x.text.includes('<|eos|>'));
  }
});

test('streaming frames concatenate to the non-streaming text for the same seed', async () => {
  const body = { ...base, prompt: ['one', 'two'], n: 2, max_tokens: 50, temperature: 0.9, seed: 99, stop: ['ab', 'Q'] };
  const full = await completions(body);
  const frames = await postStream(`${ctx.url}/v1/completions`, { ...body, stream: true, stream_options: { include_usage: true, continuous_usage_stats: true } });
  assert.is(frames[frames.length - 1], '[DONE]');
  const usageFrame = frames[frames.length - 2];
  assert.equal(usageFrame.choices, []);
  assert.equal(usageFrame.usage, full.json.usage);
  const texts = ['', '', '', ''];
  const finish: (string | null)[] = [null, null, null, null];
  for (const f of frames.slice(0, -2)) {
    assert.is(f.choices.length, 1);
    const c = f.choices[0];
    texts[c.index] += c.text;
    assert.ok(f.usage.completion_tokens >= 1);
    if (c.finish_reason) finish[c.index] = c.finish_reason;
  }
  full.json.choices.forEach((c: any, i: number) => {
    assert.is(texts[i], c.text);
    assert.is(finish[i], c.finish_reason);
  });
  const echoBody = { ...base, prompt: 'hey', max_tokens: 6, temperature: 0, echo: true, logprobs: 1, add_special_tokens: false };
  const echoed = await completions(echoBody);
  const echoFrames = (await postStream(`${ctx.url}/v1/completions`, { ...echoBody, stream: true })).slice(0, -1);
  assert.is(echoFrames.map((f) => f.choices[0].text).join(''), echoed.json.choices[0].text);
  assert.equal(echoFrames.flatMap((f) => f.choices[0].logprobs.tokens), echoed.json.choices[0].logprobs.tokens);
  assert.equal(echoFrames.flatMap((f) => f.choices[0].logprobs.token_logprobs), echoed.json.choices[0].logprobs.token_logprobs);
  assert.equal(echoFrames.flatMap((f) => f.choices[0].logprobs.text_offset), echoed.json.choices[0].logprobs.text_offset);
  assert.is(echoed.json.choices[0].logprobs.tokens.length, 3 + 6);
  assert.is(echoed.json.choices[0].logprobs.token_logprobs[0], null);
  const plain = await postStream(`${ctx.url}/v1/completions`, { ...base, max_tokens: 3, temperature: 0, stream: true });
  assert.is(plain.length, 4);
  assert.is(plain[0].usage, null);
});

test('prompt_logprobs 0 is accepted on a stream (only > 0 and -1 are refused), and the frames carry no prompt_logprobs', async () => {
  const body = { ...base, max_tokens: 3, temperature: 0 };
  const plain = await postStream(`${ctx.url}/v1/completions`, { ...body, stream: true });
  const withZero = await postStream(`${ctx.url}/v1/completions`, { ...body, stream: true, prompt_logprobs: 0 });
  assert.equal(withZero, plain.map((f) => (typeof f === 'string' ? f : { ...f, id: withZero[0].id, created: withZero[0].created })));
  for (const f of withZero.slice(0, -1)) assert.equal(Object.keys(f.choices[0]), ['index', 'text', 'logprobs', 'finish_reason', 'stop_reason']);
});

function steering(values: number[], shape: number[], layers: number[], extra: Record<string, unknown> = {}) {
  return JSON.stringify([{ activations: encodeTensor(values, shape, 'float32'), layer_indices: layers, scale: 8, norm_match: false, position_indices: null, ...extra }]);
}

test('a captured tensor has the documented shape and decodes to finite values', async () => {
  const r = await completions({ ...base, max_tokens: 5, temperature: 0, vllm_xargs: { output_residual_stream: '[2, 0]' } });
  const t = r.json.activations.residual_stream;
  assert.is(t.dtype, 'int16');
  assert.is(t.original_dtype, 'torch.bfloat16');
  assert.equal(t.shape, [2, 20 + 5 - 1, D]);
  const { values } = decodeTensor(t);
  assert.ok(values.every(Number.isFinite));
  const all = await completions({ ...base, max_tokens: 1, temperature: 0, vllm_xargs: { output_residual_stream: 'true' } });
  assert.equal(all.json.activations.residual_stream.shape, [L, 20, D]);
});

test('a steering vector changes the next-token distribution; zstd payloads are accepted', async () => {
  const v = Array.from({ length: D }, (_, i) => Math.sin(i * 1.7));
  const plain = await completions({ ...base, max_tokens: 1, temperature: 0, logprobs: 5 });
  const steered = await completions({ ...base, max_tokens: 1, temperature: 0, logprobs: 5, vllm_xargs: { apply_steering_vectors: steering(v, [1, D], [1]) } });
  assert.is(steered.status, 200);
  assert.not.equal(steered.json.choices[0].logprobs.top_logprobs, plain.json.choices[0].logprobs.top_logprobs);
  const packed = JSON.stringify([{ activations: await encodeTensorZstd(v, [1, D], 'float32'), layer_indices: [1], scale: 8, norm_match: false, position_indices: null }]);
  const zstd = await completions({ ...base, max_tokens: 1, temperature: 0, logprobs: 5, vllm_xargs: { apply_steering_vectors: packed } });
  assert.equal(zstd.json.choices, steered.json.choices);
  const bf16 = JSON.stringify([{ activations: await encodeTensorZstd(v, [1, D], 'bfloat16'), layer_indices: [1], scale: 8 }]);
  assert.is((await completions({ ...base, max_tokens: 1, vllm_xargs: { apply_steering_vectors: bf16 } })).status, 200);
});

test('norm_match keeps each steered position norm; 3-D vectors steer only their positions', async () => {
  const v = Array.from({ length: D }, (_, i) => Math.cos(i));
  const capture = { output_residual_stream: '[1]' };
  const norms = async (steer?: string) => {
    const r = await completions({ ...base, max_tokens: 1, temperature: 0, vllm_xargs: steer ? { ...capture, apply_steering_vectors: steer } : capture });
    assert.is(r.status, 200, JSON.stringify(r.json));
    const { values } = decodeTensor(r.json.activations.residual_stream);
    const out: number[][] = [];
    for (let p = 0; p < values.length / D; p++) out.push(Array.from(values.subarray(p * D, (p + 1) * D)));
    return out;
  };
  const norm = (x: number[]) => Math.sqrt(x.reduce((s, y) => s + y * y, 0));
  const original = await norms();
  const matched = await norms(steering(v, [1, D], [1], { norm_match: true }));
  original.forEach((h, p) => {
    assert.ok(Math.abs(norm(matched[p]) - norm(h)) <= 0.01 * norm(h), `position ${p}`);
    assert.not.equal(matched[p], h);
  });
  const rows = [...v, ...v];
  const positioned = await norms(steering(rows, [1, 2, D], [1], { position_indices: [3, 7] }));
  original.forEach((h, p) => {
    if (p === 3 || p === 7) assert.not.equal(positioned[p], h);
    else if (p < 3) assert.equal(positioned[p], h);
  });
  const bad = await completions({ ...base, vllm_xargs: { apply_steering_vectors: steering(v, [1, D], [L]) } });
  assert.is(bad.status, 400);
  assert.is(bad.json.error.param, 'vllm_xargs.apply_steering_vectors[0].layer_indices');
  const twoD = await completions({ ...base, vllm_xargs: { apply_steering_vectors: steering(v, [1, D], [0], { position_indices: [0] }) } });
  assert.is(twoD.status, 400);
});

test('concurrent requests give the same bodies as one at a time (no shared scratch state leaks)', async () => {
  const bodies = [
    { ...base, prompt: 'x'.repeat(300), max_tokens: 20, seed: 3, logprobs: 2, prompt_logprobs: -1 },
    { ...base, prompt: 'y'.repeat(250), max_tokens: 30, seed: 4, n: 2, logprobs: 5, prompt_logprobs: 3 },
    { ...base, prompt: 'z'.repeat(200), max_tokens: 40, seed: 5, prompt_logprobs: -1 },
  ];
  const strip = (j: any) => ({ ...j, id: null, created: null });
  const alone: any[] = [];
  for (const b of bodies) alone.push(strip((await completions(b)).json));
  const together = (await Promise.all(bodies.map((b) => completions(b)))).map((r) => strip(r.json));
  assert.equal(together, alone);
});

test('a long generation does not block /health or other requests', async () => {
  const long = fetch(`${ctx.url}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ ...base, max_tokens: 3000, ignore_eos: true, stream: true }),
  });
  const res = await long;
  const reader = res.body!.getReader();
  await reader.read(); // generation has started
  const health = await fetch(`${ctx.url}/health`);
  assert.is(health.status, 200);
  const short = await completions({ ...base, max_tokens: 2 });
  assert.is(short.status, 200);
  const next = await reader.read();
  assert.not.ok(next.done, 'the long stream is still running');
  await reader.cancel();
});

test.run();
