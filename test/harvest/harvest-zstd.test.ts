/**
 * Captures sent zstd-compressed, as vLLM with vllm-lens sends them by default: the reference engine
 * compresses them when its model says `activations.capture_compression: "zstd"`. Two models of the same
 * weights, one compressing and one not, behind one gateway: a harvest gives the same shards (every
 * tensor's bytes, the data section byte for byte) and the same statistics through either, and a
 * completion capture is relayed as the engine sent it, compressed or not, holding the same values.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { decodeTensor } from '../../src/codec/index.ts';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { readSafetensors } from '../support/safetensors.ts';

const it = suite('compressed captures');
const dir = mkdtempSync(join(tmpdir(), 'svc-harvest-zstd-'));
let gw: TestGateway;

it.before(async () => {
  const defaults = JSON.parse(readFileSync(new URL('../../infra/config/default.json', import.meta.url), 'utf8'));
  const plain = defaults.models.find((m: { id: string }) => m.id === 'ref-byte');
  const zstd = { ...plain, id: 'ref-byte-zstd', default: false, activations: { ...plain.activations, capture_compression: 'zstd' } };
  const configPath = join(dir, 'models.json');
  writeFileSync(configPath, JSON.stringify({ models: [plain, zstd] }));
  gw = await startTestGateway({ configPath });
});
it.after(async () => {
  await gw?.stop();
  rmSync(dir, { recursive: true, force: true });
});

const post = (path: string, body: unknown) => fetch(`${gw.url}${path}`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json' }, body: JSON.stringify(body) });
const prompts = ['Residual streams, compressed', 'or not', 'the same bytes in the shards', 'x'];

async function harvest(model: string) {
  const accepted = await json(await post('/v1/harvest', { model, prompts, layers: 'all', shard_size: 3, batch_size: 2 }));
  const job = await until(`the ${model} harvest to end`, async () => {
    const j = await json(await fetch(`${gw.url}/v1/harvest/${accepted.id}?wait=10`, { headers: gw.authHeaders() }));
    return ['succeeded', 'failed', 'cancelled'].includes(j.status) ? j : null;
  });
  assert.is(job.status, 'succeeded', JSON.stringify(job.error));
  const download = async (url: string) => Buffer.from(await (await fetch(`${gw.url}${url}`, { headers: gw.authHeaders() })).arrayBuffer());
  const shards = await Promise.all(job.result.shards.map((s: { url: string }) => download(s.url)));
  return { job, shards, stats: await download(job.result.stats.url) };
}

/** A file's tensors (name, dtype, shape, bytes) and its data section; the header differs only by its job id. */
function contents(file: Buffer) {
  const { metadata, tensors } = readSafetensors(file);
  const headerLength = Number(file.readBigUInt64LE(0));
  return {
    metadata: { ...metadata, job_id: '' },
    tensors: Object.fromEntries(Object.entries(tensors).map(([name, t]) => [name, [t.dtype, t.shape, Buffer.from(t.data).toString('hex')]])),
    data: file.subarray(8 + headerLength).toString('hex'),
  };
}

it('a harvest through an engine that compresses its captures writes the same shards and statistics', async () => {
  const plain = await harvest('ref-byte');
  const packed = await harvest('ref-byte-zstd');
  assert.is(packed.shards.length, 2);
  assert.equal(packed.shards.map(contents), plain.shards.map(contents));
  for (let i = 0; i < plain.shards.length; i++) {
    assert.is(packed.shards[i].length, plain.shards[i].length, `shard ${i}: the same size`);
    assert.ok(packed.shards[i].subarray(8 + Number(packed.shards[i].readBigUInt64LE(0))).equals(plain.shards[i].subarray(8 + Number(plain.shards[i].readBigUInt64LE(0)))), `shard ${i}: the same data bytes`);
  }
  assert.equal(contents(packed.stats).tensors, contents(plain.stats).tensors);
  assert.equal(packed.job.result.manifest.stats.mean_token_norm, plain.job.result.manifest.stats.mean_token_norm);
});

it('a completion capture is relayed as the engine sent it, compressed or not, with the same values', async () => {
  const ids = gw.registry.tokenizer('ref-byte').encode('Activations, please', true);
  const capture = async (model: string) => {
    const res = await post('/v1/completions', { model, prompt: ids, max_tokens: 1, temperature: 0, output_residual_stream: [0, 3] });
    const body = await json(res);
    assert.is(res.status, 200, JSON.stringify(body));
    return body.activations.residual_stream;
  };
  const plain = await capture('ref-byte');
  const packed = await capture('ref-byte-zstd');
  assert.is(plain.compression ?? null, null);
  assert.is(packed.compression, 'zstd');
  assert.equal(packed.shape, [2, ids.length, 64]);
  assert.equal(Buffer.from(packed.data, 'base64').subarray(0, 4), Buffer.from([0x28, 0xb5, 0x2f, 0xfd]), 'one zstd frame');
  assert.ok(Buffer.from(packed.data, 'base64').length < Buffer.from(plain.data, 'base64').length);
  assert.equal([...decodeTensor(packed).values], [...decodeTensor(plain).values]);
});

it.run();
