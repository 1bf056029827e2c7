/**
 * What comes after a cold boot's commit, through real HTTP: a gateway whose reference engines start on
 * demand (boot knobs, `svc engine --boot-delay-ms/--chaos-mode`), with a short request window (2 s) and
 * a longer cold-boot safety deadline (12 s). An engine whose small body breaks off after the 200 went
 * out gives a top-level `error` in that 200 body, and the keepalives stop; the request window times the
 * generation, not the boot; a boot that outlasts the deadline is `platform_cold_boot`, no breaker failure.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { json, startTestGateway, type TestGateway } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { loadSettings } from '../../src/config/index.ts';
import type { EngineBootKnobs, LocalProcessPlatform } from '../../src/platforms/index.ts';
import { backendEvents, backendStream } from '../../events/backend.ts';

const knobs: EngineBootKnobs = {};
const it = suite<{ gw: TestGateway }>('cold boots: late failures, the request window and the boot deadline');
const models = loadSettings().models.filter((m) => m.id === 'ref-byte');
it.before(async (context) => {
  const engines = { ...loadSettings({}, { models }).engines, warmAtStart: false, idleMs: 60_000, ackTimeoutMs: 20_000, graceMs: 300, keepaliveMs: 200, bootDeadlineMs: 12_000 };
  context.gw = await startTestGateway({ models, engines, requestWindowMs: 2_000 }, { engineBootKnobs: knobs, chaosEngines: true });
});
it.after(async ({ gw }) => {
  await gw?.stop();
});

const platform = (gw: TestGateway) => gw.platforms.get('ref-byte') as LocalProcessPlatform;

/** Scales the engine to zero as its idle window would (once nothing holds it or boots it), then sets the knobs of its next boot. */
async function coldModel(gw: TestGateway, set: EngineBootKnobs): Promise<void> {
  await until('the engine to be scaled to zero', async () => {
    platform(gw).scaleToZero();
    return platform(gw).url === null && !platform(gw).booting;
  }, 60_000, 50);
  Object.assign(knobs, { delayMs: undefined, fail: undefined, startStallMs: undefined, chaosMode: undefined }, set);
}

/** A non-streaming completion; the client gives up after a minute (a body that never ends fails the test, not hangs it). */
async function complete(gw: TestGateway): Promise<{ res: Response; text: string }> {
  const res = await fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: gw.authHeaders({ 'content-type': 'application/json' }),
    body: JSON.stringify({ prompt: 'cold', max_tokens: 4, temperature: 0 }),
    signal: AbortSignal.timeout(60_000),
  });
  return { res, text: await res.text() };
}

async function backendLog(gw: TestGateway) {
  await gw.commands.settled();
  return (await gw.store.readStream(backendStream('ref-byte'))).events.map((e) => backendEvents.parse(e));
}

it('an engine whose small body breaks off after the commit: a top-level error in the 200 body, and the keepalives stop', async ({ gw }) => {
  // The new engine's first completion sends its headers and a few bytes of its body, then the process dies.
  await coldModel(gw, { delayMs: 1_000, chaosMode: 'tear' });
  const { res, text } = await complete(gw);
  knobs.chaosMode = undefined; // the engine started again after the crash serves normally
  assert.is(res.status, 200, 'committed to 200 while booting');
  assert.is(res.headers.get('x-svc-upstream-error-kind'), null, 'headers went out before the failure');
  assert.match(text, /^ +\{/, 'keepalive whitespace, then one JSON value, and the body ends');
  const body = JSON.parse(text);
  assert.is(body.error.code, 'upstream_unreachable');
  assert.is(body.request_id, res.headers.get('x-request-id'));
  assert.is(body.choices, undefined);
});

it('a boot longer than the request window but within the deadline: served, the window counts only the generation', async ({ gw }) => {
  // The process waits 4 s before listening: the boot outlasts the 2 s window, whatever the machine's speed.
  await coldModel(gw, { delayMs: 4_000 });
  const { res, text } = await complete(gw);
  assert.is(res.status, 200);
  const body = JSON.parse(text);
  assert.is(body.error, undefined, `served, not ${JSON.stringify(body.error)}`);
  assert.is(body.object, 'text_completion');
});

it('a boot that outlasts the safety deadline: platform_cold_boot in the 200 body, and no breaker failure', async ({ gw }) => {
  await coldModel(gw, { delayMs: 60_000 });
  const failuresBefore = (await backendLog(gw)).filter((e) => e.type === 'BackendFailed').length;
  const { res, text } = await complete(gw);
  assert.is(res.status, 200);
  const body = JSON.parse(text);
  assert.is(body.error.code, 'platform_cold_boot', JSON.stringify(body.error));
  assert.match(body.error.message, /safety deadline/);
  // A boot that never finished is no fault of the engine's: nothing is counted against its breaker.
  const health = await json(await fetch(`${gw.url}/health`));
  const backend = health.backends.find((b: { model_id: string }) => b.model_id === 'ref-byte');
  assert.is(backend.breaker_consecutive_failures, 0);
  assert.is((await backendLog(gw)).filter((e) => e.type === 'BackendFailed').length, failuresBefore);
});

it.run();
