/**
 * Shutdown after clients left: a gateway whose clients aborted a slow stream and a slow non-streamed
 * completion mid-way, or holds a connection on which no request was ever sent, closes at once rather
 * than after its whole shutdown grace. Node counts a connection with no request yet as busy until its
 * headersTimeout (60 s), and Node's fetch opens such a spare connection after an aborted request: the
 * drain used to wait for the grace (SVC_SHUTDOWN_GRACE_MS, 60 s by default) because of it.
 * The bound below is the behaviour asked for (well under the 20 s grace), not a benchmark.
 */
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { connect, type Socket } from 'node:net';
import { once } from 'node:events';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';
import { loadSettings } from '../../src/config/index.ts';
import { within } from '../support/within.ts';

const graceMs = 20_000;
// ref-byte only: nothing here calls ref-gpt2, whose engine would start for nothing.
const models = loadSettings().models.filter((m) => m.id === 'ref-byte');
const closedWellWithinMs = 12_000;

async function timedStop(gw: TestGateway): Promise<number> {
  const started = performance.now();
  await within(graceMs + 10_000, gw.stop(), 'the gateway to close');
  return performance.now() - started;
}

function complete(gw: TestGateway, stream: boolean, signal: AbortSignal) {
  return fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: gw.authHeaders({ 'content-type': 'application/json' }),
    body: JSON.stringify({ prompt: 'slow', max_tokens: 60, temperature: 0, stream }),
    signal,
  });
}

test('clients that left a slow stream and a slow completion mid-way do not hold the shutdown for its grace', async () => {
  const gw = await startTestGateway({ models, shutdownGraceMs: graceMs }, { chaosEngines: true });
  let stopped = false;
  try {
    // 200 ms per token for the next two generations: both are surely still running when their clients leave.
    const chaos = await fetch(`${gw.engineUrls.get('ref-byte')}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: 'delay', delay_ms: 200, count: 2 }) });
    assert.is(chaos.status, 200);
    await chaos.arrayBuffer();

    const streamLeaves = new AbortController();
    const stream = await complete(gw, true, streamLeaves.signal);
    assert.is(stream.status, 200);
    const first = await stream.body!.getReader().read();
    assert.ok(first.value && first.value.length > 0, 'the stream started');

    const bodyLeaves = new AbortController();
    const body = complete(gw, false, bodyLeaves.signal).catch((err: Error) => err.name);
    await new Promise((resolve) => setTimeout(resolve, 600)); // the engine call is under way
    streamLeaves.abort();
    bodyLeaves.abort();
    assert.is(await body, 'AbortError');
    await new Promise((resolve) => setTimeout(resolve, 200));

    const took = await timedStop(gw);
    stopped = true;
    assert.ok(took < closedWellWithinMs, `closed in ${Math.round(took)} ms, not well under the ${graceMs} ms grace`);
  } finally {
    if (!stopped) await gw.stop();
  }
});

test('a connection on which no request was sent does not hold the shutdown; one request under way is still answered whole', async () => {
  const gw = await startTestGateway({ models, shutdownGraceMs: graceMs }, { chaosEngines: true });
  let stopped = false;
  const { hostname, port } = new URL(gw.url);
  const silent: Socket = connect(Number(port), hostname);
  try {
    await once(silent, 'connect');
    const silentClosed = once(silent, 'close');
    silent.resume();
    // A short generation in flight at the close: it drains, and is not cut.
    const chaos = await fetch(`${gw.engineUrls.get('ref-byte')}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: 'delay', delay_ms: 100, count: 1 }) });
    await chaos.arrayBuffer();
    const inFlight = fetch(`${gw.url}/v1/completions`, {
      method: 'POST',
      headers: gw.authHeaders({ 'content-type': 'application/json' }),
      body: JSON.stringify({ prompt: 'drain me', max_tokens: 5, temperature: 0 }),
    }).then(async (res) => ({ status: res.status, body: (await res.json()) as { object?: string } }));
    await new Promise((resolve) => setTimeout(resolve, 200));

    const took = await timedStop(gw);
    stopped = true;
    assert.ok(took < closedWellWithinMs, `closed in ${Math.round(took)} ms, not well under the ${graceMs} ms grace`);
    await within(1_000, silentClosed, 'the silent connection to be closed by the gateway');
    const answered = await inFlight;
    assert.is(answered.status, 200, 'the request under way at the close was answered');
    assert.is(answered.body.object, 'text_completion');
  } finally {
    silent.destroy();
    if (!stopped) await gw.stop();
  }
});

test.run();
