/**
 * A request refused by a failed boot holds nothing and is recorded as rejected (issue 28, Metering):
 * a cold model's boot that fails within the grace, or whose process stalls before the platform
 * acknowledges it, is 503 platform_cold_boot before any reservation is made, recorded as a
 * RequestRejected on the key's meter (no BudgetReserved, no settlement, no hold). Through real HTTP,
 * a gateway whose reference engines start on demand, slowed, failed or stalled by the boot knobs.
 * A boot that outlasts the grace still commits to 200 with keepalives (test/api/cold-boot.test.ts).
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { issueKey, json, startTestGateway, type TestGateway } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { loadSettings } from '../../src/config/index.ts';
import type { EngineBootKnobs, LocalProcessPlatform } from '../../src/platforms/index.ts';
import { meterDecider } from '../../deciders/meter.ts';
import { foldEvents } from '../../src/event-sourcing/index.ts';
import { meterEvents, meterStream, utcDay, type MeterEvent } from '../../events/meter.ts';

const knobs: EngineBootKnobs = {};
const it = suite<{ gw: TestGateway }>('a request refused by a failed boot');
it.before(async (context) => {
  // A grace long enough that a boot told to fail fails within it, and an acknowledgement timeout inside
  // the grace: both well over a reference engine's start under tsx on a 2-core machine loaded by other
  // work (seconds, and tens of seconds at a load average of 20), so that a boot told to fail is not
  // taken for a stalled one.
  const engines = { ...loadSettings({}, { models: [] }).engines, warmAtStart: false, idleMs: 6_000, ackTimeoutMs: 30_000, graceMs: 40_000, keepaliveMs: 200 };
  context.gw = await startTestGateway({ engines }, { engineBootKnobs: knobs });
});
it.after(async ({ gw }) => {
  await gw?.stop();
});

const platform = (gw: TestGateway) => gw.platforms.get('ref-byte') as LocalProcessPlatform;

/** Scales the engine to zero as its idle window would (once no request holds it), then sets the boot knobs. */
async function coldModel(gw: TestGateway, set: EngineBootKnobs): Promise<void> {
  await until('the engine to be scaled to zero', async () => {
    platform(gw).scaleToZero();
    return platform(gw).url === null && !platform(gw).booting;
  }, 60_000, 50);
  knobs.delayMs = set.delayMs;
  knobs.fail = set.fail;
  knobs.startStallMs = set.startStallMs;
}

async function complete(gw: TestGateway, key: string, body: Record<string, unknown> = {}) {
  return fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'cold', max_tokens: 4, temperature: 0, ...body }),
  });
}

/** The key's meter events today once its rejection is recorded. */
async function rejectedOn(gw: TestGateway, key: string): Promise<MeterEvent[]> {
  return until('the refusal to be recorded', async () => {
    await gw.commands.settled();
    const read = await gw.store.readStream(meterStream(key.split('_')[1], utcDay(new Date())));
    const events = read.events.map((e) => meterEvents.parse(e));
    return events.some((e) => e.type === 'RequestRejected') ? events : null;
  }, 10_000, 25);
}

function assertRejectedHoldingNothing(events: MeterEvent[], requestId: string): void {
  const rejected = events.filter((e) => e.type === 'RequestRejected');
  assert.is(rejected.length, 1);
  const data = rejected[0].data as { request_id: string; code: string; status: number; model: string | null; retry_after_seconds: number | null };
  assert.is(data.code, 'platform_cold_boot');
  assert.is(data.status, 503);
  assert.is(data.model, 'ref-byte');
  assert.ok(data.request_id.startsWith(requestId), 'the refused request');
  assert.ok((data.retry_after_seconds ?? 0) > 0, 'with the Retry-After it was given');
  assert.equal(events.filter((e) => e.type === 'BudgetReserved' || e.type === 'UsageSettled' || e.type === 'RequestQueued'), [], 'nothing was reserved, so nothing settled');
  const state = foldEvents(meterDecider, meterDecider.initialState(), events);
  assert.is(state.holds.size, 0, 'no hold');
}

it('a boot that fails within the grace: 503 platform_cold_boot, recorded as rejected, nothing held', async ({ gw }) => {
  await coldModel(gw, { delayMs: 100, fail: true });
  const key = await issueKey(gw.url, gw.adminToken, { email: 'boot-failed@example.org' });
  const res = await complete(gw, key);
  const body = await json(res);
  assert.is(res.status, 503);
  assert.is(body.error.code, 'platform_cold_boot');
  assert.match(body.error.message, /failed to boot/);
  assert.ok(Number(res.headers.get('retry-after')) > 0);
  assertRejectedHoldingNothing(await rejectedOn(gw, key), res.headers.get('x-request-id')!);
  // The key's slots are all free: the next boot (not told to fail) serves it.
  knobs.fail = undefined;
  const next = await complete(gw, key);
  assert.is(next.status, 200);
  assert.is((await json(next)).object, 'text_completion');
});

it('a process that stalls before the acknowledgement: 503 platform_cold_boot, recorded as rejected, nothing held', async ({ gw }) => {
  await coldModel(gw, { startStallMs: 60_000 });
  const key = await issueKey(gw.url, gw.adminToken, { email: 'boot-stalled@example.org' });
  const res = await complete(gw, key, { stream: true });
  const body = await json(res);
  assert.is(res.status, 503, 'a stream too: nothing was committed');
  assert.is(body.error.code, 'platform_cold_boot');
  assert.match(body.error.message, /stalled/);
  assertRejectedHoldingNothing(await rejectedOn(gw, key), res.headers.get('x-request-id')!);
  knobs.startStallMs = undefined;
});

it.run();
