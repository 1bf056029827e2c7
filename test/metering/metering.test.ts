/**
 * Metering end to end, one gateway: reserve, settle with the engine's usage, clamp to a budget, refuse
 * past it, bill streams (and disconnected streams), record refusals; through real HTTP, a real store
 * and real reference engines.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { issueKey, json, startTestGateway, type TestGateway } from '../support/gateway.ts';
import { loadSettings } from '../../src/config/index.ts';
import { meterDecider } from '../../deciders/meter.ts';
import { foldEvents } from '../../src/event-sourcing/index.ts';
import { meterEvents, meterStream, utcDay, type MeterEvent } from '../../events/meter.ts';
import { assertRollingMinuteLimit } from '../support/rate-window.ts';
import { until } from '../support/until.ts';

const it = suite<{ gw: TestGateway }>('metering');
it.before(async (context) => {
  // ref-byte only: nothing here calls ref-gpt2, whose engine would start for nothing.
  context.gw = await startTestGateway({ models: loadSettings().models.filter((m) => m.id === 'ref-byte') }, { chaosEngines: true });
});
it.after(async ({ gw }) => {
  await gw?.stop();
});

const prefixOf = (key: string) => key.split('_')[1];

/** The key's meter events of yesterday and today, in order: a test that runs across UTC midnight sees both days' streams. */
async function meterEventsOf(gw: TestGateway, key: string): Promise<MeterEvent[]> {
  await gw.commands.settled();
  const now = Date.now();
  const days = [utcDay(new Date(now - 86_400_000)), utcDay(new Date(now))];
  const reads = await Promise.all(days.map((day) => gw.store.readStream(meterStream(prefixOf(key), day))));
  return reads.flatMap((read) => read.events.map((e) => meterEvents.parse(e)));
}

async function complete(gw: TestGateway, key: string, body: Record<string, unknown>, headers: Record<string, string> = {}) {
  return fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}`, ...headers },
    body: JSON.stringify(body),
  });
}

/** Waits until the metering appended what the responses imply (settlement follows the response). */
function settledCount(gw: TestGateway, key: string, count: number): Promise<MeterEvent[]> {
  return until(`${count} settlements`, async () => {
    const events = await meterEventsOf(gw, key);
    return events.filter((e) => e.type === 'UsageSettled').length >= count ? events : null;
  }, 10_000, 25);
}

it("a completion reserves its worst case, then settles the engine's real usage, with metadata only", async ({ gw }) => {
  const key = await issueKey(gw.url, gw.adminToken, { email: 'meter@example.org' });
  const res = await complete(gw, key, { prompt: 'Hello there', max_tokens: 7, temperature: 0, user: 'alice' }, { 'x-svc-workload': 'batch' });
  assert.is(res.status, 200);
  const body = await json(res);
  const events = await settledCount(gw, key, 1);
  // The key's first request in this process takes a slot lease of one (see SlotsLeased).
  assert.equal(events.map((e) => e.type), ['MeterOpened', 'SlotsLeased', 'BudgetReserved', 'UsageSettled']);
  const reserved = events[2].data as Extract<MeterEvent, { type: 'BudgetReserved' }>['data'];
  const settled = events[3].data as Extract<MeterEvent, { type: 'UsageSettled' }>['data'];
  assert.is(reserved.input_tokens, body.usage.prompt_tokens);
  assert.is(reserved.output_tokens, 7);
  assert.is(settled.input_tokens, body.usage.prompt_tokens);
  assert.is(settled.output_tokens, body.usage.completion_tokens);
  assert.is(settled.status, 200);
  assert.is(settled.key_prefix, prefixOf(key));
  assert.is(settled.email, 'meter@example.org');
  assert.is(settled.user, 'alice');
  assert.is(settled.workload, 'batch');
  assert.is(settled.request_id, res.headers.get('x-request-id'));
  const state = foldEvents(meterDecider, meterDecider.initialState(), events);
  assert.is(state.holds.size, 0, 'the hold is released');
});

it('max_tokens is lowered to fit the budget, then the budget refuses with 429 naming it', async ({ gw }) => {
  const key = await issueKey(gw.url, gw.adminToken, { email: 'small@example.org', daily_token_budget: 40 });
  // ref-byte: one token per byte plus BOS, so "abcd" is 5 prompt tokens.
  const first = await complete(gw, key, { prompt: 'abcd', max_tokens: 100, temperature: 0 });
  assert.is(first.status, 200);
  assert.is(first.headers.get('x-svc-max-tokens-clamped'), 'requested=100,applied=35,reason=budget,source=client');
  const used = (await json(first)).usage.total_tokens;
  await settledCount(gw, key, 1);
  if (used >= 40 - 5) {
    const refused = await complete(gw, key, { prompt: 'abcd', max_tokens: 10, temperature: 0 });
    assert.is(refused.status, 429);
    const error = (await json(refused)).error;
    assert.is(error.code, 'budget_exceeded');
    assert.is(error.budget, 'daily_token_budget');
    // Nothing held any more: not worth retrying before the UTC day turns.
    const now = new Date();
    const untilMidnight = (Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate() + 1) - now.getTime()) / 1000;
    const retryAfter = Number(refused.headers.get('retry-after'));
    assert.ok(Math.abs(retryAfter - untilMidnight) < 5, `Retry-After ${retryAfter} s, ${untilMidnight} s to midnight`);
  }
  const events = await meterEventsOf(gw, key);
  const charged = events.filter((e) => e.type === 'UsageSettled').reduce((n, e) => n + (e.data as { input_tokens: number; output_tokens: number }).input_tokens + (e.data as { output_tokens: number }).output_tokens, 0);
  assert.ok(charged <= 40, `charged ${charged} of a 40-token budget`);
});

it('a stream is billed though the client did not ask for usage (the usage frame is not forwarded)', async ({ gw }) => {
  const key = await issueKey(gw.url, gw.adminToken, { email: 'stream@example.org' });
  const res = await complete(gw, key, { prompt: 'Once', max_tokens: 9, temperature: 0, stream: true });
  const text = await res.text();
  assert.not.match(text, /"choices":\[\]/, 'no usage frame for a client that did not ask');
  const frames = text.split('\n\n').filter((f) => f.startsWith('data: {'));
  assert.ok(frames.every((f) => JSON.parse(f.slice(6)).choices.length > 0));
  const events = await settledCount(gw, key, 1);
  const settled = events.find((e) => e.type === 'UsageSettled')!.data as { output_tokens: number; input_tokens: number };
  assert.is(settled.output_tokens, frames.length);
  assert.ok(settled.input_tokens > 0);

  const withUsage = await complete(gw, key, { prompt: 'Once', max_tokens: 9, temperature: 0, stream: true, stream_options: { include_usage: true } });
  const usageFrames = (await withUsage.text()).split('\n\n').filter((f) => f.includes('"choices":[]'));
  assert.is(usageFrames.length, 1, 'the client that asked gets the usage frame');
  await settledCount(gw, key, 2);
});

it('a client that leaves a stream is billed for the tokens generated before it left', async ({ gw }) => {
  const key = await issueKey(gw.url, gw.adminToken, { email: 'leaver@example.org' });
  const engineUrl = gw.engineUrls.get('ref-byte')!;
  await fetch(`${engineUrl}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: 'delay', count: 1, delay_ms: 20 }) });
  const controller = new AbortController();
  const res = await complete(gw, key, { prompt: 'Slow', max_tokens: 2000, temperature: 0, stream: true });
  const reader = res.body!.getReader();
  let received = '';
  while ((received.match(/\n\n/g) ?? []).length < 5) received += new TextDecoder().decode((await reader.read()).value);
  await reader.cancel();
  controller.abort();
  const events = await settledCount(gw, key, 1);
  const settled = events.find((e) => e.type === 'UsageSettled')!.data as { output_tokens: number; disconnected: boolean };
  assert.ok(settled.output_tokens >= 5, `billed ${settled.output_tokens} tokens`);
  assert.ok(settled.output_tokens < 2000, 'the generation was cancelled');
  assert.is(settled.disconnected, true);
});

it('a request refused after authentication is recorded, metadata only', async ({ gw }) => {
  const key = await issueKey(gw.url, gw.adminToken, { email: 'refused@example.org' });
  const res = await complete(gw, key, { prompt: 'x', max_tokens: 0 });
  assert.is(res.status, 400);
  await gw.commands.settled();
  for (let i = 0; i < 200; i++) {
    const events = await meterEventsOf(gw, key);
    const rejected = events.find((e) => e.type === 'RequestRejected');
    if (rejected) {
      assert.is((rejected.data as { code: string }).code, 'invalid_request');
      assert.is((rejected.data as { status: number }).status, 400);
      return;
    }
    await new Promise((r) => setTimeout(r, 25));
  }
  assert.unreachable('no RequestRejected event');
});

it('at most 600 request starts per rolling minute, then 429 rate_limited with Retry-After', async ({ gw }) => {
  const key = await issueKey(gw.url, gw.adminToken, { email: 'rate@example.org' });
  const statuses: number[] = [];
  let retryAfter: string | null = null;
  const started = Date.now();
  // 31 batches of 20 pass the limit within a minute on a quiet machine; a busy one, whose first starts
  // leave the window before the 601st, goes on until the limit refuses (it does once 600 start in a minute).
  for (let batch = 0; batch < 31 || (batch < 150 && !statuses.includes(429)); batch++) {
    const responses = await Promise.all(Array.from({ length: 20 }, () => complete(gw, key, { prompt: 'r', max_tokens: 1, temperature: 0 })));
    for (const r of responses) {
      statuses.push(r.status);
      if (r.status === 429) {
        assert.is((await json(r)).error.code, 'rate_limited');
        retryAfter ??= r.headers.get('retry-after');
      } else await r.arrayBuffer();
    }
  }
  const refused = statuses.filter((s) => s === 429).length;
  assert.ok(refused > 0, 'some requests were refused');
  assert.ok(Number(retryAfter) >= 1 && Number(retryAfter) <= 60);
  const events = await until('every refusal recorded', async () => {
    const recorded = await meterEventsOf(gw, key);
    return recorded.filter((e) => e.type === 'RequestRejected').length >= refused ? recorded : null;
  }, 10_000, 25);
  assert.is(events.filter((e) => e.type === 'RequestRejected').length, refused, 'every refusal is recorded');
  assertRollingMinuteLimit(events, 600);
  // Inside one minute the counts are exact (a slower machine lets the first starts leave the window).
  if (Date.now() - started < 60_000) {
    assert.is(statuses.filter((s) => s === 200).length, 600);
    assert.is(refused, 20);
  }
});

it('a paused key is refused 401 at authentication; a key paused while its request waited in the queue is refused 403', async ({ gw }) => {
  const key = await issueKey(gw.url, gw.adminToken, { email: 'queue@example.org' });
  const prefix = prefixOf(key);
  const engineUrl = gw.engineUrls.get('ref-byte')!;
  await fetch(`${engineUrl}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: 'delay', count: 16, delay_ms: 30 }) });
  const running = Array.from({ length: 16 }, () => complete(gw, key, { prompt: 'busy', max_tokens: 20, temperature: 0 }));
  // Wait until all 16 hold their slots, then queue one more and pause the key under it.
  for (let i = 0; i < 400; i++) {
    const events = await meterEventsOf(gw, key);
    if (events.filter((e) => e.type === 'BudgetReserved').length === 16) break;
    await new Promise((r) => setTimeout(r, 10));
  }
  const waiting = complete(gw, key, { prompt: 'late', max_tokens: 2, temperature: 0 });
  await new Promise((r) => setTimeout(r, 50));
  const paused = await fetch(`${gw.url}/admin/keys/${prefix}/pause`, { method: 'POST', headers: gw.adminHeaders() });
  assert.is(paused.status, 200);
  const late = await waiting;
  assert.is(late.status, 403);
  assert.is((await json(late)).error.code, 'invalid_api_key');
  for (const r of await Promise.all(running)) assert.is(r.status, 200);
  const after = await complete(gw, key, { prompt: 'x', max_tokens: 1 });
  assert.is(after.status, 401);
});

it.run();
