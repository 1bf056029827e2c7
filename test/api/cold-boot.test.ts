/**
 * Cold boots through real HTTP: a gateway whose reference engines start on demand and stop after an
 * idle window, booted slowly, failing, or stalling through the engine's own boot knobs
 * (`svc engine --boot-delay-ms/--boot-fail/--start-stall-ms`). Each test starts from a cold model.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import OpenAI from 'openai';
import { issueKey, json, startTestGateway, type TestGateway } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { loadSettings } from '../../src/config/index.ts';
import type { EngineBootKnobs, LocalProcessPlatform } from '../../src/platforms/index.ts';
import { meterDecider } from '../../deciders/meter.ts';
import { foldEvents } from '../../src/event-sourcing/index.ts';
import { meterEvents, meterStream, utcDay } from '../../events/meter.ts';
import { backendEvents, backendStream } from '../../events/backend.ts';
import { captureSlabs } from '../../src/engine-client/slab-body.ts';

const knobs: EngineBootKnobs = {};
const it = suite<{ gw: TestGateway }>('cold boots');
it.before(async (context) => {
  // The idle window is also how long a published stage stays fresh: long enough that a busy machine
  // reads a stage before it ages out, short enough for the idle window's own test.
  const engines = { ...loadSettings({}, { models: [] }).engines, warmAtStart: false, idleMs: 6_000, ackTimeoutMs: 45_000, graceMs: 300, keepaliveMs: 200 };
  context.gw = await startTestGateway({ engines }, { engineBootKnobs: knobs });
});
it.after(async ({ gw }) => {
  await gw?.stop();
});

const platform = (gw: TestGateway, model = 'ref-byte') => gw.platforms.get(model) as LocalProcessPlatform;

/**
 * Scales the model's engine to zero as its idle window would (once no request holds it), then sets the
 * boot knobs. Only the idle window's own test waits for the window.
 */
async function coldModel(gw: TestGateway, set: EngineBootKnobs, model = 'ref-byte'): Promise<void> {
  await until('the engine to be scaled to zero', async () => {
    platform(gw, model).scaleToZero();
    return platform(gw, model).url === null && !platform(gw, model).booting;
  }, 60_000, 50);
  knobs.delayMs = set.delayMs;
  knobs.fail = set.fail;
  knobs.startStallMs = set.startStallMs;
}

function complete(gw: TestGateway, body: Record<string, unknown>, signal?: AbortSignal, key = gw.apiKey) {
  return fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'cold', max_tokens: 4, temperature: 0, ...body }),
    signal,
  });
}

async function status(gw: TestGateway, model = 'ref-byte') {
  return json(await fetch(`${gw.url}/v1/models/${model}/status`, { headers: gw.authHeaders() }));
}

it('a slow boot: 200 at once, keepalive whitespace, then the engine body; status shows the stages, then warm', async ({ gw }) => {
  await coldModel(gw, { delayMs: 2_000 });
  const cold = await status(gw);
  assert.is(cold.boot, null, 'a cold model that was never started has no fresh boot stage');
  assert.is(cold.warm, false);
  assert.is(cold.runners, 0);
  const spawns = platform(gw).spawns;
  const res = await complete(gw, {});
  assert.is(res.status, 200, 'committed to 200 while booting');
  assert.is(res.headers.get('content-type'), 'application/json');
  assert.is(res.headers.get('x-svc-upstream-model'), 'svc/ref-byte-4l-64d-dummy');
  const reader = res.body!.getReader();
  const first = Buffer.from((await reader.read()).value!).toString('utf8');
  assert.match(first, /^ +$/, 'keepalive bytes are whitespace');
  const booting = await status(gw);
  assert.ok(booting.boot && booting.boot.stage !== 'serving', `a boot stage while booting: ${JSON.stringify(booting.boot)}`);
  assert.type(booting.boot.age_seconds, 'number');
  assert.is(booting.warm, false);
  assert.ok(booting.activation_boot, 'ref-byte has an activation engine');
  let text = first;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    text += Buffer.from(value).toString('utf8');
  }
  assert.match(text, /^ +\{/, 'whitespace, then the body');
  const body = JSON.parse(text);
  assert.is(body.object, 'text_completion');
  assert.is(body.choices.length, 1);
  assert.is(platform(gw).spawns, spawns + 1);
  const warm = await status(gw);
  assert.is(warm.boot.stage, 'serving');
  assert.is(warm.warm, true);
  assert.is(warm.runners, 1);
  assert.is(warm.activation_boot.stage, 'serving');
  // Every stage is an event on the model's backend stream, in boot order.
  const logged = await until('the boot stages in the log', async () => {
    await gw.commands.settled();
    const read = await gw.store.readStream(backendStream('ref-byte'));
    const stages = read.events.map((e) => backendEvents.parse(e)).flatMap((e) => (e.type === 'BootStagePublished' ? [e.data.stage] : []));
    return stages.includes('serving') ? stages : null;
  }, 10_000, 25);
  assert.equal(logged, ['waiting_for_gpu', 'container_started', 'weights_loading', 'weights_loaded', 'engine_ready', 'serving']);
});

it('the official openai client reads a body that follows keepalive whitespace', async ({ gw }) => {
  await coldModel(gw, { delayMs: 1_500 });
  const openai = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: gw.apiKey, maxRetries: 0 });
  const completion = await openai.completions.create({ model: 'ref-byte', prompt: 'Hello', max_tokens: 3, temperature: 0 });
  assert.is(completion.object, 'text_completion');
  assert.is(completion.usage?.completion_tokens, completion.usage!.total_tokens - completion.usage!.prompt_tokens);
});

it('a capture after the commit: keepalive whitespace, then the engine body whole; its slabs given back', async ({ gw }) => {
  await coldModel(gw, { delayMs: 1_500 });
  const res = await complete(gw, { prompt: 'Capture', max_tokens: 2, output_residual_stream: [0, 2] });
  assert.is(res.status, 200);
  const text = await res.text();
  assert.match(text, /^ +\{/, 'whitespace, then the body');
  const body = JSON.parse(text);
  assert.is(body.activations.residual_stream.shape[0], 2, text.slice(0, 300));
  assert.is(body.choices.length, 1);
  assert.ok(captureSlabs.created > 0, 'the body was read into slabs');
  await until('every slab given back', async () => captureSlabs.lent === 0);
});

it('a stream: SSE keepalive comments, then the frames and [DONE]', async ({ gw }) => {
  await coldModel(gw, { delayMs: 1_500 });
  const res = await complete(gw, { stream: true });
  assert.is(res.status, 200);
  assert.match(res.headers.get('content-type')!, /^text\/event-stream/);
  const text = await res.text();
  assert.match(text, /^: keepalive\n\n/);
  const frames = text.split('\n\n').filter((f) => f && !f.startsWith(':'));
  assert.is(frames[frames.length - 1], 'data: [DONE]');
  assert.ok(frames.length >= 2);
  for (const frame of frames.slice(0, -1)) assert.is(JSON.parse(frame.slice('data: '.length)).object, 'text_completion');
});

it('a boot that fails after the commit: a 200 whose body is a top-level error', async ({ gw }) => {
  await coldModel(gw, { delayMs: 1_000, fail: true });
  const res = await complete(gw, {});
  assert.is(res.status, 200);
  assert.is(res.headers.get('x-svc-upstream-error-kind'), null, 'headers went out before the failure');
  const text = await res.text();
  assert.match(text, /^ +\{/);
  const body = JSON.parse(text);
  assert.is(body.error.code, 'platform_cold_boot');
  assert.is(body.request_id, res.headers.get('x-request-id'));
  assert.is(body.choices, undefined);
  const failed = await status(gw);
  assert.is(failed.boot.stage, 'failed');
  assert.match(failed.boot.reason, /boot/);
  assert.is(failed.warm, false);
});

it('a stream whose boot fails: keepalive comments, an error frame, [DONE]', async ({ gw }) => {
  await coldModel(gw, { delayMs: 1_000, fail: true });
  const res = await complete(gw, { stream: true });
  assert.is(res.status, 200);
  const text = await res.text();
  assert.match(text, /^: keepalive\n\n/);
  const frames = text.split('\n\n').filter((f) => f && !f.startsWith(':'));
  assert.is(frames.length, 2);
  assert.is(JSON.parse(frames[0].slice('data: '.length)).error.code, 'platform_cold_boot');
  assert.is(frames[1], 'data: [DONE]');
});

it('20 concurrent requests to a cold model start one engine process', async ({ gw }) => {
  await coldModel(gw, { delayMs: 1_000 });
  const spawns = platform(gw).spawns;
  const responses = await Promise.all(Array.from({ length: 20 }, (_, i) => complete(gw, { prompt: `cold ${i}` })));
  const bodies = await Promise.all(responses.map((r) => r.text()));
  for (const [i, res] of responses.entries()) {
    assert.is(res.status, 200);
    assert.is(JSON.parse(bodies[i]).object, 'text_completion', bodies[i].slice(0, 200));
  }
  assert.is(platform(gw).spawns, spawns + 1, 'one boot shared by all 20');
});

it('the idle window stops the engine; the next request boots it again', async ({ gw }) => {
  await coldModel(gw, {});
  const spawns = platform(gw).spawns;
  const first = await complete(gw, {});
  assert.is(first.status, 200);
  assert.is(JSON.parse(await first.text()).object, 'text_completion');
  const pid = gw.enginePids.get('ref-byte')!;
  await until('the idle stop', async () => platform(gw).runners() === 0, 60_000, 50);
  await until('the engine process to exit', async () => {
    try {
      process.kill(pid, 0);
      return false;
    } catch {
      return true;
    }
  }, 10_000, 50);
  assert.is((await status(gw)).warm, false);
  const second = await complete(gw, {});
  assert.is(second.status, 200);
  assert.is(JSON.parse(await second.text()).object, 'text_completion');
  assert.is(platform(gw).spawns, spawns + 2);
  assert.is.not(gw.enginePids.get('ref-byte'), pid, 'a new engine process');
});

it('a client that leaves during a boot holds no slot and no budget afterwards', async ({ gw }) => {
  await coldModel(gw, { delayMs: 3_000 });
  const key = await issueKey(gw.url, gw.adminToken, { email: 'cold-leaver@example.org' });
  const client = new AbortController();
  const res = await complete(gw, { max_tokens: 50 }, client.signal, key);
  assert.is(res.status, 200);
  const reader = res.body!.getReader();
  assert.match(Buffer.from((await reader.read()).value!).toString('utf8'), /^ +$/, 'waiting out the boot');
  client.abort();
  const prefix = key.split('_')[1];
  const events = await until('the hold to be settled', async () => {
    await gw.commands.settled();
    const read = await gw.store.readStream(meterStream(prefix, utcDay(new Date())));
    const parsed = read.events.map((e) => meterEvents.parse(e));
    return parsed.some((e) => e.type === 'UsageSettled') ? parsed : null;
  }, 10_000, 25);
  const state = foldEvents(meterDecider, meterDecider.initialState(), events);
  assert.is(state.holds.size, 0, 'no hold remains: the slot and the reservation are released');
  const settled = events.find((e) => e.type === 'UsageSettled')!.data as { output_tokens: number; basis: string };
  assert.is(settled.output_tokens, 0, 'the engine never ran: nothing generated is billed');
  assert.is(settled.basis, 'not_run');
  // The boot goes on without the client; the key can use all its slots again once it serves.
  const after = await complete(gw, {}, undefined, key);
  assert.is(after.status, 200);
  assert.is(JSON.parse(await after.text()).object, 'text_completion');
});

it('a process that stalls before the platform acknowledges the boot: 503 platform_cold_boot with Retry-After', async ({ gw }) => {
  await coldModel(gw, { startStallMs: 120_000 });
  const spawns = platform(gw).spawns;
  const res = await complete(gw, {});
  const body = await json(res);
  assert.is(res.status, 503);
  assert.is(body.error.code, 'platform_cold_boot');
  assert.ok(Number(res.headers.get('retry-after')) > 0);
  assert.is(res.headers.get('x-svc-upstream-error-kind'), 'platform_cold_boot');
  assert.is(body.request_id, res.headers.get('x-request-id'));
  assert.is(platform(gw).spawns, spawns + 1);
  const stalled = await status(gw);
  assert.is(stalled.boot.stage, 'failed');
  assert.match(stalled.boot.reason, /did not start/);
  // The stalled process was given up: the next boot starts afresh and serves.
  knobs.startStallMs = undefined;
  const next = await complete(gw, {});
  assert.is(next.status, 200);
  assert.is(JSON.parse(await next.text()).object, 'text_completion');
  assert.is(platform(gw).spawns, spawns + 2);
});

it.run();
