import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { captureRequest, engineCaptureBody, postHashed, startCaptureStub, stubModel, STUB_CHECKPOINT, type CaptureStub } from '../support/capture.ts';
import { BodyEnds } from '../../src/api/usage-relay.ts';
import { createHash } from 'node:crypto';
import { gunzipSync } from 'node:zlib';
import { request } from 'undici';

// An 11 MB capture (16 layers x 129 positions x 2048, bf16) from a stub engine process that answers at
// once, relayed by a real gateway; the 610 MB one is in capture-large.test.ts.
const capture = suite('capture relay: 11 MB');
let stub: CaptureStub;
let gw: TestGateway;

capture.before(async () => {
  stub = await startCaptureStub();
  gw = await startTestGateway({ models: [stubModel(stub.url)] });
});
capture.after(async () => {
  await gw?.stop();
  await stub?.stop();
});

const POSITIONS = 129;
const BYTES_11MB = 4 * Math.ceil((16 * POSITIONS * 2048 * 2) / 3);

function viaGateway(req: Record<string, unknown>, headers: Record<string, string> = {}) {
  return postHashed(`${gw.url}/v1/completions`, JSON.stringify(req), undefined, { ...gw.authHeaders(), ...headers });
}

function assertUpstreamError(res: Awaited<ReturnType<typeof postHashed>>, status: number, code: string): any {
  assert.is(res.status, status, res.head);
  const body = JSON.parse(res.head);
  assert.is(body.error.code, code);
  assert.is(res.headers['x-svc-upstream-error-kind'], code);
  assert.is(res.headers['x-svc-upstream-model'], STUB_CHECKPOINT);
  assert.ok(Number(res.headers['retry-after']) > 0);
  return body;
}

capture('every layer: the engine body arrives byte-identical, with its length', async () => {
  const req = captureRequest('whole', POSITIONS);
  const direct = await postHashed(`${stub.url}/v1/completions`, engineCaptureBody(req));
  assert.is(direct.status, 200);
  assert.ok(direct.bytes > BYTES_11MB && direct.bytes < BYTES_11MB + 1024, String(direct.bytes));
  // A capture is relayed byte for byte even to a client that accepts gzip (README, compression).
  const relayed = await viaGateway(req, { origin: 'https://notebook.example', 'x-request-id': 'capture-headers-1', 'accept-encoding': 'gzip' });
  assert.is(relayed.status, 200, relayed.head);
  assert.is(relayed.headers['content-encoding'], undefined);
  assert.is(relayed.bytes, direct.bytes);
  assert.is(relayed.sha256, direct.sha256);
  assert.is(relayed.headers['content-length'], String(direct.bytes));
  assert.is(relayed.headers['content-type'], 'application/json');
  assert.is(relayed.headers['x-svc-upstream-model'], STUB_CHECKPOINT);
  // Written straight to the socket (the whole body was held), with every header a reply carries.
  assert.is(relayed.headers['x-request-id'], 'capture-headers-1');
  assert.is(relayed.headers['access-control-allow-origin'], '*');
});

capture('with full-vocabulary prompt logprobs beside it, a capture is gzipped for a client that accepts it (the contract compresses those)', async () => {
  const req = captureRequest('whole', POSITIONS);
  const direct = await postHashed(`${stub.url}/v1/completions`, engineCaptureBody(req));
  const res = await request(`${gw.url}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ ...req, prompt_logprobs: -1 }),
    headers: { 'content-type': 'application/json', 'accept-encoding': 'gzip', ...gw.authHeaders() },
  });
  const zipped = Buffer.from(await res.body.arrayBuffer());
  assert.is(res.statusCode, 200, zipped.subarray(0, 300).toString());
  assert.is(res.headers['content-encoding'], 'gzip');
  const body = gunzipSync(zipped);
  assert.is(createHash('sha256').update(body).digest('hex'), direct.sha256);
  // Without Accept-Encoding it is relayed as it is.
  const plain = await viaGateway({ ...req, prompt_logprobs: -1 });
  assert.is(plain.headers['content-encoding'], undefined);
  assert.is(plain.sha256, direct.sha256);
});

capture('an envelope ahead of the rest of the body is judged there, and the rest streamed through', async () => {
  const req = captureRequest('first', POSITIONS);
  const direct = await postHashed(`${stub.url}/v1/completions`, engineCaptureBody(req));
  assert.ok(direct.head.startsWith('{"activations"'));
  const relayed = await viaGateway(req, { 'accept-encoding': 'gzip' });
  assert.is(relayed.status, 200, relayed.head);
  assert.is(relayed.headers['content-encoding'], undefined);
  assert.is(relayed.sha256, direct.sha256);
  assert.is(relayed.headers['content-length'], String(direct.bytes), "the engine's announced length");
});

capture('a layer list is judged by its own length', async () => {
  const relayed = await viaGateway(captureRequest('whole', POSITIONS, [0, 5, 15]));
  assert.is(relayed.status, 200, relayed.head);
  const fewer = await viaGateway(captureRequest('fewer', POSITIONS, [0, 5, 15]));
  assert.match(assertUpstreamError(fewer, 502, 'capture_incomplete').error.message, /returned 2 of 3 requested layers/);
});

capture('fewer layers than requested: 502 capture_incomplete', async () => {
  const res = await viaGateway(captureRequest('fewer', POSITIONS));
  const body = assertUpstreamError(res, 502, 'capture_incomplete');
  assert.is(body.error.message, 'the activation capture returned 15 of 16 requested layers');
  assert.is(body.request_id, res.headers['x-request-id']);
});

capture('no activations in the body (an engine without the capture path): 502 capture_incomplete', async () => {
  const res = await viaGateway(captureRequest('none', POSITIONS));
  assert.match(assertUpstreamError(res, 502, 'capture_incomplete').error.message, /returned 0 of 16/);
});

capture('small fields that are not valid JSON: 502 upstream_server_error with the upstream status', async () => {
  const res = await viaGateway(captureRequest('malformed', POSITIONS));
  const body = assertUpstreamError(res, 502, 'upstream_server_error');
  assert.is(body.error.upstream_status, 200);
  assert.match(body.error.message, /capture response is malformed: the body is not valid JSON at byte \d+/);
});

capture('the engine connection breaking inside the data: 502 upstream_unreachable, nothing half-sent', async () => {
  const res = await viaGateway(captureRequest('break', POSITIONS));
  assertUpstreamError(res, 502, 'upstream_unreachable');
  const after = await viaGateway(captureRequest('whole', POSITIONS));
  assert.is(after.status, 200, 'the gateway serves the next capture');
});

capture('each capture is settled with the usage its body carries, or refused and settled as 502', async () => {
  // The stub writes usage before the activations (vLLM's order): it is read from the body's first bytes.
  const whole = await viaGateway(captureRequest('whole', POSITIONS), { 'x-request-id': 'settle-whole' });
  const first = await viaGateway(captureRequest('first', POSITIONS), { 'x-request-id': 'settle-first' });
  const fewer = await viaGateway(captureRequest('fewer', POSITIONS), { 'x-request-id': 'settle-fewer' });
  assert.equal([whole.status, first.status, fewer.status], [200, 200, 502]);
  type Settled = { status: number; basis: string; input_tokens: number; output_tokens: number; disconnected: boolean };
  const settled = async (id: string): Promise<Settled> => {
    for (let i = 0; i < 100; i++) {
      const { rows } = await gw.store.query<{ data: Settled }>(`SELECT data FROM events WHERE event_type = 'UsageSettled' AND data->>'request_id' LIKE $1`, [`${id}.%`]);
      if (rows[0]) return rows[0].data;
      await new Promise((r) => setTimeout(r, 50));
    }
    throw new Error(`${id} was not settled`);
  };
  for (const id of ['settle-whole', 'settle-first']) {
    const s = await settled(id);
    assert.equal([s.status, s.basis, s.input_tokens, s.output_tokens, s.disconnected], [200, 'engine_usage', POSITIONS, 1, false], id);
  }
  const refused = await settled('settle-fewer');
  assert.equal([refused.status, refused.basis, refused.input_tokens, refused.output_tokens], [502, 'engine_usage', POSITIONS, 1]);
});

capture('clients that leave while the capture is read: each settled, the gateway serves on', async () => {
  // Left at different moments: before the engine call, while its body is read and held, while it is written.
  for (let i = 0; i < 40; i++) {
    const controller = new AbortController();
    const res = fetch(`${gw.url}/v1/completions`, {
      method: 'POST',
      headers: { ...gw.authHeaders(), 'content-type': 'application/json', 'x-request-id': `left-${i}` },
      body: JSON.stringify(captureRequest('whole', POSITIONS)),
      signal: controller.signal,
    })
      .then((r) => r.arrayBuffer())
      .catch(() => null); // left before or after the headers: either way the fetch ends aborted
    setTimeout(() => controller.abort(), i);
    await res;
  }
  const after = await viaGateway(captureRequest('whole', POSITIONS));
  assert.is(after.status, 200, 'the gateway serves the next capture');
  for (let i = 0; i < 40; i++) {
    const id = `left-${i}`;
    // A request that reached the gateway was reserved; every reservation is settled.
    await until(`${id} settled if it was reserved`, async () => {
      const { rows } = await gw.store.query<{ event_type: string }>(`SELECT event_type FROM events WHERE data->>'request_id' LIKE $1`, [`${id}.%`]);
      const types = rows.map((r) => r.event_type);
      return !types.includes('BudgetReserved') || types.includes('UsageSettled') || null;
    });
  }
});

capture.run();

// The relay reads a capture's usage from the body's ends as its chunks pass (BodyEnds): the last 4 KiB,
// kept by reference when a chunk is that long, or the first 64 KiB (a capture's usage, ahead of its data).
const ends = suite('capture relay: the usage at either end of a body, however it is chunked');

const usageText = '"usage":{"prompt_tokens":7,"total_tokens":9,"completion_tokens":2}';
const usage = { prompt_tokens: 7, completion_tokens: 2 };

function usageOf(body: Buffer, sizes: number[]): ReturnType<BodyEnds['usage']> {
  const seen = new BodyEnds();
  for (let at = 0, i = 0; at < body.length; i++) {
    const size = sizes[i % sizes.length];
    seen.add(body.subarray(at, at + size));
    at += size;
  }
  return seen.usage();
}

const chunkings = [[1], [7, 4095], [4096], [4097, 3], [65_536], [65_536, 10, 10, 10], [10, 65_536]];

ends('usage at the end (a completion), read from the last bytes whatever the chunks', () => {
  const body = Buffer.from(`{"choices":[{"text":"${'x'.repeat(100_000)}"}],${usageText}}`);
  for (const sizes of chunkings) assert.equal(usageOf(body, sizes), usage, String(sizes));
});

ends('usage at the start and a long body after it (a capture), read from the first bytes', () => {
  const body = Buffer.from(`{"choices":[],${usageText},"activations":{"data":"${'A'.repeat(200_000)}"}}`);
  for (const sizes of chunkings) assert.equal(usageOf(body, sizes), usage, String(sizes));
});

ends('usage past the first 64 KiB and before the last 4 KiB is not read, even from one long last chunk', () => {
  const body = Buffer.from(`{"a":"${'x'.repeat(70_000)}",${usageText},"b":"${'y'.repeat(5000)}"}`);
  for (const sizes of [...chunkings, [body.length]]) assert.is(usageOf(body, sizes), null, String(sizes));
  // The same body with its usage moved into the last 4 KiB is read.
  const late = Buffer.from(`{"a":"${'x'.repeat(70_000)}","b":"${'y'.repeat(5000)}",${usageText}}`);
  for (const sizes of [...chunkings, [late.length]]) assert.equal(usageOf(late, sizes), usage, String(sizes));
});

ends.run();
