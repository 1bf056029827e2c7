/**
 * A steering vector is bounded by the model before anything is forwarded: a valid 44 KB zstd frame
 * declaring 1 GiB for shape [4, 67108864] float32, on a model 64 wide, is 400 `invalid_request` in the
 * envelope and never reaches the engine (a real listener that counts what it receives), while a
 * vector of the model's shape goes through.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';
import { startFailingEngine, staticModel, type FailingEngine } from '../support/failing-engine.ts';
import { assertDocumented } from '../support/openapi.ts';

const it = suite('steering vectors bounded by the model over HTTP');
let gw: TestGateway;
let engine: FailingEngine;
let doc: any;

it.before(async () => {
  engine = await startFailingEngine('ok');
  const model = { ...staticModel(engine.url, 'steerable'), activations: { n_layers: 4, d_model: 64, max_steering_vectors: 8, max_activation_prompt_tokens: 1024 } };
  gw = await startTestGateway({ models: [model] });
  doc = await json(await fetch(`${gw.url}/openapi.json`));
});
it.after(async () => {
  await gw?.stop();
  await engine?.close();
});

/** A real zstd frame of RLE blocks (128 KiB each) declaring and holding `size` zero bytes. */
function rleFrame(size: number): Buffer {
  const blocks = Math.max(1, Math.ceil(size / 131_072));
  const b = Buffer.alloc(13 + blocks * 4);
  b.writeUInt32LE(0xfd2fb528, 0);
  b[4] = 0xe0; // 8-byte content size, single segment
  b.writeBigUInt64LE(BigInt(size), 5);
  for (let i = 0, left = size; i < blocks; i++) {
    const n = Math.min(left, 131_072);
    left -= n;
    b.writeUIntLE((i === blocks - 1 ? 1 : 0) | (1 << 1) | (n << 3), 13 + i * 4, 3);
  }
  return b;
}

const steer = (activations: Record<string, unknown>, layers: number[]) =>
  fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { ...gw.authHeaders(), 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'steer', max_tokens: 1, apply_steering_vectors: [{ activations, layer_indices: layers }] }),
  });

it('a 44 KB frame declaring 1 GiB for a shape 67,108,864 wide: 400 invalid_request, nothing reaches the engine', async () => {
  const data = rleFrame(2 ** 30).toString('base64');
  assert.ok(data.length < 48_000, `${data.length} characters`);
  const res = await steer({ data, dtype: 'float32', shape: [4, 67_108_864], compression: 'zstd' }, [0, 1, 2, 3]);
  const body = await json(res);
  assert.is(res.status, 400);
  assert.is(body.error.code, 'invalid_request');
  assert.is(body.error.type, 'invalid_request_error');
  assert.match(body.error.message, "apply_steering_vectors[0].activations.shape[1]: is 67108864 but model steerable's residual stream is 64 wide (d_model)");
  assert.is(body.request_id, res.headers.get('x-request-id'));
  assertDocumented(doc, 'POST', '/v1/completions', res);
  assert.is(engine.received, 0);
});

it('a frame followed by another: 400, nothing reaches the engine; the model\'s own shape goes through', async () => {
  const one = rleFrame(4 * 64 * 4);
  const res = await steer({ data: Buffer.concat([one, rleFrame(2 ** 30)]).toString('base64'), dtype: 'float32', shape: [4, 64], compression: 'zstd' }, [0, 1, 2, 3]);
  const body = await json(res);
  assert.is(res.status, 400);
  assert.is(body.error.code, 'invalid_request');
  assert.match(body.error.message, 'must be one zstd frame');
  assert.is(engine.received, 0);

  const ok = await steer({ data: one.toString('base64'), dtype: 'float32', shape: [4, 64], compression: 'zstd' }, [0, 1, 2, 3]);
  assert.is(ok.status, 200, await ok.clone().text());
  await ok.arrayBuffer();
  assert.is(engine.received, 1);
});

it.run();
