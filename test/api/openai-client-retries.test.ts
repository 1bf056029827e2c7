/**
 * The official client's retries against our 429s, with its defaults (maxRetries 2): `openai` sleeps
 * whatever `Retry-After` says, so a 429 that no retry within a minute can fix (a monthly budget spent,
 * the daily spend cap) must say `X-Should-Retry: false` and make it throw at once; a short wait (a hold
 * still open) must not, so the client retries by itself.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import OpenAI from 'openai';
import { loadServiceConfig } from '../../src/config/index.ts';
import { issueKey, startTestGateway, type TestGateway } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { within } from '../support/within.ts';

type RateLimitError = InstanceType<typeof OpenAI.RateLimitError>;

/** A client as the README builds it (default retries), counting the HTTP requests it makes. */
function countingClient(gw: TestGateway, apiKey: string): { openai: OpenAI; requests: () => number } {
  let requests = 0;
  const counting: typeof fetch = (input, init) => {
    requests++;
    return fetch(input, init);
  };
  return { openai: new OpenAI({ baseURL: `${gw.url}/v1`, apiKey, fetch: counting }), requests: () => requests };
}

/** Calls left sleeping on a Retry-After when an assertion gave up on them; they must not keep the file alive. */
let stranded = 0;

/**
 * The client's rejection, or a failure naming `what` if it has not thrown within `ms` (it is sleeping on
 * Retry-After). Whether it retried is told by the requests counted, not by the time: `ms` is only the
 * bound that keeps a sleeping client from hanging the file, generous for a busy machine.
 */
async function rejectionWithin(ms: number, call: Promise<unknown>, what: string): Promise<RateLimitError> {
  try {
    await within(ms, call, what);
  } catch (err) {
    if (err instanceof OpenAI.RateLimitError) return err;
    if (err instanceof Error && err.message.endsWith(`not within ${ms} ms`)) stranded++;
    throw err;
  }
  assert.unreachable(`${what}: the call succeeded`);
  throw new Error('unreachable');
}

/** The seconds from `now` to the next UTC midnight. */
const secondsToUtcMidnight = (now = new Date()) => (Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate() + 1) - now.getTime()) / 1000;

/** Both long waits end at a UTC midnight; within a minute and a half of one they are short, so wait past it. */
async function clearOfUtcMidnight(): Promise<void> {
  const left = secondsToUtcMidnight();
  if (left < 90) await new Promise((r) => setTimeout(r, (left + 2) * 1000));
}

const refByte = loadServiceConfig(null).models.filter((m) => m.id === 'ref-byte');

// --- budgets ---------------------------------------------------------------------------------------

const budget = suite<{ gw: TestGateway }>('official openai client: budget_exceeded');
budget.before(async (context) => {
  await clearOfUtcMidnight();
  context.gw = await startTestGateway({ models: refByte }, { chaosEngines: true });
});
budget.after(async ({ gw }) => {
  await gw?.stop();
});

budget('a key out of monthly budget: the client throws RateLimitError without retrying; Retry-After stays', async ({ gw }) => {
  const key = await issueKey(gw.url, gw.adminToken, { email: 'spent@example.org', monthly_token_budget: 0 });
  const { openai, requests } = countingClient(gw, key);
  const err = await rejectionWithin(30_000, openai.completions.create({ model: 'ref-byte', prompt: 'Hello', max_tokens: 8 }), 'a key out of budget');
  assert.is(err.status, 429);
  assert.is(err.code, 'budget_exceeded');
  assert.is(err.headers.get('x-should-retry'), 'false');
  assert.ok(Number(err.headers.get('retry-after')) > 60, `Retry-After ${err.headers.get('retry-after')}: the seconds until the month turns`);
  assert.is(requests(), 1, 'no retry');
});

budget('a budget held by a running request: Retry-After 1 without X-Should-Retry, and the client retries by itself', async ({ gw }) => {
  const key = await issueKey(gw.url, gw.adminToken, { email: 'held@example.org', monthly_token_budget: 300 });
  // A slow stream whose hold (clamped to the budget) takes all of it while it runs.
  await fetch(`${gw.engineUrls.get('ref-byte')}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: 'delay', count: 1, delay_ms: 20 }) });
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
    const { openai, requests } = countingClient(gw, key);
    // The stream runs for seconds yet, so both retries (about 1 s apart) find the hold still open.
    const err = await rejectionWithin(30_000, openai.completions.create({ model: 'ref-byte', prompt: 'Hello', max_tokens: 8 }), 'a budget held');
    assert.is(err.code, 'budget_exceeded');
    assert.is(err.headers.get('retry-after'), '1');
    assert.is(err.headers.get('x-should-retry'), null);
    assert.is(requests(), 3, 'the first call and both retries');
  } finally {
    await reader.cancel();
  }
});

// --- the spend cap ---------------------------------------------------------------------------------

const cap = suite<{ gw: TestGateway }>('official openai client: spend_cap');
cap.before(async (context) => {
  await clearOfUtcMidnight();
  // Priced so that any completion crosses the cap.
  context.gw = await startTestGateway({ models: refByte.map((m) => ({ ...m, cost_per_second: 1 })), dailySpendCap: 1e-9 });
});
cap.after(async ({ gw }) => {
  await gw?.stop();
  // Left sleeping on a long Retry-After (the assertion failed already): end the file rather than hang it.
  if (stranded > 0) setTimeout(() => process.exit(1), 200).unref();
});

cap('past the daily spend cap: the client throws RateLimitError without retrying; Retry-After stays', async ({ gw }) => {
  const first = await fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: gw.authHeaders({ 'content-type': 'application/json' }), body: JSON.stringify({ prompt: 'Hello', max_tokens: 4 }) });
  assert.is(first.status, 200, 'the request that crosses the cap is served');
  await first.text();
  // The spend watcher reports the day's spend after the priced settlement, which follows the response.
  await until('the spend cap', async () => {
    const r = await fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: gw.authHeaders({ 'content-type': 'application/json' }), body: JSON.stringify({ prompt: 'Hello', max_tokens: 1 }) });
    const body = await r.text();
    return r.status === 429 && JSON.parse(body).error.code === 'spend_cap';
  }, 10_000, 25);
  const { openai, requests } = countingClient(gw, gw.apiKey);
  const err = await rejectionWithin(30_000, openai.completions.create({ model: 'ref-byte', prompt: 'Hello', max_tokens: 8 }), 'the spend cap');
  assert.is(err.status, 429);
  assert.is(err.code, 'spend_cap');
  assert.is(err.headers.get('x-should-retry'), 'false');
  assert.ok(Math.abs(Number(err.headers.get('retry-after')) - secondsToUtcMidnight()) < 5, `Retry-After ${err.headers.get('retry-after')}: the seconds until the next UTC day`);
  assert.is(requests(), 1, 'no retry');
});

budget.run();
cap.run();
