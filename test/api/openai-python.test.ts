/**
 * The official `openai` Python package against a real gateway, as researchers drive it: completions
 * (single, batched, streamed with the usage chunk), lm-evaluation-harness's loglikelihood requests,
 * and the typed exceptions with the package's default retries. Each call is a scenario of
 * `python/openai_client.py`, run by the interpreter in SVC_PYTHON (a venv with the pinned package:
 * `infra/dev/services.sh start` makes one and prints it) with the base URL and key in its environment;
 * it prints JSON and the assertions are here. Without SVC_PYTHON the tests are reported skipped; with
 * an SVC_PYTHON that cannot import `openai` they fail (CI sets it on purpose).
 */
import { execFile } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { loadServiceConfig } from '../../src/config/index.ts';
import { issueKey, json, startTestGateway, type TestGateway } from '../support/gateway.ts';
import { scrape } from '../support/metrics.ts';

const python = process.env.SVC_PYTHON;
const script = fileURLToPath(new URL('./python/openai_client.py', import.meta.url));

/** SVC_PYTHON's stdout for `args`, its environment ours with `env` added and no OPENAI_* (the scripts set the client up themselves). */
function run(args: string[], env: Record<string, string>): Promise<string> {
  const base = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith('OPENAI_')));
  return new Promise((resolve, reject) => {
    // Asynchronous: the gateway answering the script runs in this process.
    execFile(python!, args, { env: { ...base, PYTHONDONTWRITEBYTECODE: '1', ...env }, timeout: 120_000, maxBuffer: 16 << 20 }, (err, stdout) => {
      // The message names the command, and holds its stderr (the traceback).
      if (err) reject(err);
      else resolve(stdout);
    });
  });
}

/** One scenario of openai_client.py against `gw` with `apiKey`; what it printed. */
async function scenario(gw: TestGateway, name: string, apiKey = gw.apiKey): Promise<any> {
  const out = await run([script, name], { SVC_BASE_URL: `${gw.url}/v1`, SVC_API_KEY: apiKey });
  return JSON.parse(out).result;
}

/** The 429s the gateway answered on /v1/completions, whatever the model label. */
async function completions429(gw: TestGateway): Promise<number> {
  const lines = (await scrape(gw)).split('\n').filter((l) => l.startsWith('svc_http_requests_total{') && l.includes('route="/v1/completions"') && l.includes('status="429"'));
  return lines.reduce((sum, l) => sum + Number(l.slice(l.lastIndexOf(' ') + 1)), 0);
}

/** The same completion over raw HTTP, for what the package parsed to be compared with what was sent. */
async function raw(gw: TestGateway, body: Record<string, unknown>): Promise<any> {
  const res = await fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: gw.authHeaders({ 'content-type': 'application/json' }), body: JSON.stringify(body) });
  const parsed = await json(res);
  assert.is(res.status, 200, JSON.stringify(parsed));
  return parsed;
}

/** An APIStatusError of the expected class, status and code, whose request id is the body's. */
function assertFailure(failure: any, exception: string, status: number, code: string): void {
  assert.is(failure.exception, exception, JSON.stringify(failure));
  assert.ok(failure.is_api_status_error);
  assert.is(failure.status_code, status);
  assert.is(failure.code, code);
  assert.type(failure.message, 'string');
  assert.ok(failure.request_id, 'X-Request-Id reaches the exception');
  assert.is(failure.request_id, failure.body_request_id);
}

const close = (a: number, b: number, what: string) => assert.ok(Math.abs(a - b) < 1e-4, `${what}: ${a} against ${b}`);

const refByte = loadServiceConfig(null).models.filter((m) => m.id === 'ref-byte');
const PROMPT_TOKENS = 17; // "Once upon a time": BOS and 16 bytes

type Context = { gw: TestGateway };
const cases: [string, (context: Context) => Promise<void>][] = [];
const test = (name: string, fn: (context: Context) => Promise<void>) => cases.push([name, fn]);

test('completions.create: text, usage and finish_reason as the gateway sent them; engine-native parameters through extra_body', async ({ gw }) => {
  const { plain, native } = await scenario(gw, 'completion');
  const sent = await raw(gw, { model: 'ref-byte', prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
  assert.is(plain.object, 'text_completion');
  assert.is(plain.model, 'svc/ref-byte-4l-64d-dummy');
  assert.match(plain.id, /./);
  assert.is(plain.choices.length, 1);
  const [choice] = plain.choices;
  assert.is(choice.index, 0);
  assert.is(choice.text, sent.choices[0].text);
  assert.ok(choice.text.length > 0);
  assert.is(choice.finish_reason, 'length');
  assert.is(choice.stop_reason, null);
  assert.is(choice.logprobs, null);
  assert.equal(plain.usage, { ...plain.usage, prompt_tokens: PROMPT_TOKENS, completion_tokens: 8, total_tokens: PROMPT_TOKENS + 8 });
  assert.is(native.choices.length, 1);
  assert.is(native.usage.completion_tokens, 4);
});

test('a list of prompts in one request: one choice per prompt, each at its index, each the completion its prompt gets alone', async ({ gw }) => {
  const { batched, singles } = await scenario(gw, 'batch');
  assert.equal(batched.choices.map((c: any) => c.index), [0, 1, 2]);
  assert.equal(batched.choices.map((c: any) => c.text), singles);
  assert.ok(new Set(singles).size > 1, `distinct prompts, distinct completions: ${JSON.stringify(singles)}`);
  for (const c of batched.choices) assert.is(c.finish_reason, 'length');
  assert.equal(batched.usage, { ...batched.usage, prompt_tokens: 5 + 7 + 6, completion_tokens: 9, total_tokens: 27 });
});

test('a stream with include_usage: one chunk per token, finish_reason on the last, then a usage chunk with no choices', async ({ gw }) => {
  const { chunks, whole } = await scenario(gw, 'stream');
  const usage = chunks.at(-1);
  assert.equal(usage.choices, []);
  assert.equal(usage.usage, { ...usage.usage, prompt_tokens: PROMPT_TOKENS, completion_tokens: 8, total_tokens: PROMPT_TOKENS + 8 });
  const content = chunks.slice(0, -1);
  assert.is(content.length, 8);
  for (const [i, chunk] of content.entries()) {
    assert.is(chunk.object, 'text_completion');
    assert.is(chunk.choices.length, 1);
    assert.is(chunk.choices[0].index, 0);
    assert.is(chunk.choices[0].finish_reason, i === content.length - 1 ? 'length' : null);
    assert.is(chunk.usage, null);
  }
  assert.is(content.map((c: any) => c.choices[0].text).join(''), whole.choices[0].text);
});

test("lm-evaluation-harness's loglikelihood: echoed token-id prompts' logprobs (the first None), the continuation's sum and is-greedy as lm-eval computes them", async ({ gw }) => {
  const { requests, response, results, generated, max_tokens_zero } = await scenario(gw, 'loglikelihood');
  assert.equal(response.choices.map((c: any) => c.index), [0, 1, 2]);
  for (const [i, { context_ids, continuation_ids }] of requests.entries()) {
    const lp = response.choices[i].logprobs;
    const ids = [...context_ids, ...continuation_ids];
    assert.is(lp.tokens.length, ids.length + 1, 'every prompt token, then the one generated');
    assert.is(lp.token_logprobs.length, lp.tokens.length);
    assert.is(lp.top_logprobs.length, lp.tokens.length);
    assert.is(lp.text_offset.length, lp.tokens.length);
    assert.is(lp.tokens[0], '<|bos|>');
    assert.is(lp.token_logprobs[0], null, 'the first prompt token has no logprob');
    assert.is(lp.top_logprobs[0], null);
    assert.is(lp.tokens.slice(1, ids.length).join(''), Buffer.from(ids.slice(1)).toString());
    for (let j = 1; j < lp.tokens.length; j++) {
      assert.ok(lp.token_logprobs[j] <= 0, `token_logprobs[${j}]`);
      assert.is(lp.top_logprobs[j][lp.tokens[j]], lp.token_logprobs[j], `top_logprobs[${j}] holds the token itself`);
    }
    // The same positions' logprobs through the engine-native prompt_logprobs, by token id.
    const scored = await raw(gw, { model: 'ref-byte', prompt: ids, max_tokens: 1, temperature: 0, prompt_logprobs: 0 });
    const positions = scored.choices[0].prompt_logprobs;
    let expected = 0;
    for (let j = context_ids.length; j < ids.length; j++) expected += positions[j][String(ids[j])].logprob;
    close(results[i].loglikelihood, expected, `request ${i}: the continuation's loglikelihood`);
  }
  // The model's own greedy continuation: greedy, and scored as it was generated.
  assert.is(results[0].is_greedy, true);
  close(results[0].loglikelihood, generated.choices[0].logprobs.token_logprobs.reduce((a: number, b: number) => a + b, 0), 'the greedy continuation as generated');
  assert.is(results[1].is_greedy, false);
  assert.ok(results[1].loglikelihood < results[0].loglikelihood);
  // The older harness's max_tokens=0 is outside the contract (1 to 1,000,000).
  assertFailure(max_tokens_zero, 'BadRequestError', 400, 'invalid_request');
  assert.match(max_tokens_zero.message, /max_tokens/);
});

test('a text prompt echoed with logprobs: text_offset places each token in the echoed text', async ({ gw }) => {
  const completion = await scenario(gw, 'echo_text');
  const [choice] = completion.choices;
  assert.ok(choice.text.startsWith('Hi there'), choice.text);
  const { tokens, token_logprobs, top_logprobs, text_offset } = choice.logprobs;
  assert.is(tokens.length, 9 + 2);
  assert.is(tokens[0], '<|bos|>');
  assert.is(token_logprobs[0], null);
  assert.is(text_offset[0], 0);
  for (let j = 1; j < tokens.length; j++) {
    assert.is(choice.text.slice(text_offset[j], text_offset[j] + tokens[j].length), tokens[j], `token ${j} at ${text_offset[j]}`);
    assert.ok(Object.keys(top_logprobs[j]).length <= 3, 'the token and at most two alternatives');
  }
  assert.is(completion.usage.prompt_tokens, 9);
});

test('400s raise openai.BadRequestError with our code: unknown model, unknown field through extra_body, chat completions', async ({ gw }) => {
  const failures = await scenario(gw, 'bad_requests');
  assertFailure(failures.model_not_found, 'BadRequestError', 400, 'model_not_found');
  assertFailure(failures.unknown_field, 'BadRequestError', 400, 'invalid_request');
  assert.match(failures.unknown_field.message, /no_such_field/);
  assertFailure(failures.chat, 'BadRequestError', 400, 'chat_completions_unsupported');
});

test('a wrong key raises openai.AuthenticationError (401 invalid_api_key), once', async ({ gw }) => {
  const failure = await scenario(gw, 'unauthenticated', 'svc_not_a_key_0000000000000000');
  assertFailure(failure, 'AuthenticationError', 401, 'invalid_api_key');
  assert.is(failure.requests, 1);
});

test('a key out of monthly budget raises openai.RateLimitError at once: X-Should-Retry false, so the default client does not retry', async ({ gw }) => {
  const key = await issueKey(gw.url, gw.adminToken, { email: 'spent@example.org', monthly_token_budget: 0 });
  const before = await completions429(gw);
  const failure = await scenario(gw, 'rate_limited', key);
  assertFailure(failure, 'RateLimitError', 429, 'budget_exceeded');
  assert.is(failure.x_should_retry, 'false');
  assert.ok(Number(failure.retry_after) > 0, `Retry-After ${failure.retry_after}`);
  assert.is(failure.requests, 1, 'the client sent one request');
  assert.is((await completions429(gw)) - before, 1, 'the gateway answered one 429');
});

test('a budget held by a running request (Retry-After 1, no X-Should-Retry): the default client retries twice, then raises RateLimitError', async ({ gw }) => {
  const key = await issueKey(gw.url, gw.adminToken, { email: 'held@example.org', monthly_token_budget: 300 });
  // A stream whose hold (clamped to the budget) takes all of it; its tokens come a second apart, so it runs for minutes unless cancelled.
  const chaos = await fetch(`${gw.engineUrls.get('ref-byte')}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: 'delay', count: 1, delay_ms: 1000 }) });
  assert.is(chaos.status, 200);
  const slow = await fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
    body: JSON.stringify({ model: 'ref-byte', prompt: 'Slow', max_tokens: 1000, temperature: 0, stream: true }),
  });
  assert.is(slow.status, 200);
  assert.match(slow.headers.get('x-svc-max-tokens-clamped') ?? '', /reason=budget/);
  const reader = slow.body!.getReader();
  await reader.read();
  try {
    const before = await completions429(gw);
    const failure = await scenario(gw, 'rate_limited', key);
    assertFailure(failure, 'RateLimitError', 429, 'budget_exceeded');
    assert.is(failure.retry_after, '1');
    assert.is(failure.x_should_retry, null);
    assert.is(failure.requests, 3, 'the first request and both retries');
    assert.is((await completions429(gw)) - before, 3);
  } finally {
    await reader.cancel();
  }
});

const client = suite<Context>('official openai Python client against the gateway');
if (!python) {
  const reason = 'SKIPPED: SVC_PYTHON is not set (a Python with the openai package: `infra/dev/services.sh start` prints one)';
  console.log(`openai-python: ${reason}`);
  for (const [name] of cases) client.skip(`${name}: ${reason}`, () => {});
} else {
  client.before(async (context) => {
    try {
      // SVC_PYTHON set on purpose: an interpreter that cannot import openai fails the file, it is not skipped.
      const version = (await run(['-c', 'import openai; print(openai.__version__)'], {})).trim();
      console.log(`openai-python: ${python} imports openai ${version}`);
      context.gw = await startTestGateway({ models: refByte }, { chaosEngines: true });
    } catch (err) {
      // uvu counts the suite's tests failed but prints nothing of an error in a before hook.
      console.error(`openai-python: ${err instanceof Error ? err.message : err}`);
      throw err;
    }
  });
  client.after(async ({ gw }) => {
    await gw?.stop();
  });
  for (const [name, fn] of cases) client(name, fn);
}
client.run();
