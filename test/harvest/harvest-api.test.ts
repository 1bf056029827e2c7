/**
 * Harvests through real HTTP: a gateway on port 0 with its PGlite store, its reference engine and
 * its in-process worker. A job is submitted (202), long-polled to its end, and its shards downloaded
 * and read back as safetensors against the model's tokenizer and shape; the submit's checks answer
 * in the contract's envelope; jobs are visible to keys of the same user only; long-polls beyond the
 * caps are declined; a running job can be cancelled once; harvest tokens are metered on the key.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { createHash } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadSettings } from '../../src/config/index.ts';
import { startTestGateway, issueKey, json, type TestGateway } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { assertDocumented } from '../support/openapi.ts';
import { readSafetensors } from '../support/safetensors.ts';

const it = suite('harvests over HTTP');
const storage = mkdtempSync(join(tmpdir(), 'svc-harvest-api-'));
const defaults = loadSettings({ ...process.env, DATABASE_URL: '', SVC_HARVEST_DIR: storage }).harvest;
let gw: TestGateway;
let doc: any;

it.before(async () => {
  gw = await startTestGateway(
    {
      harvest: { ...defaults, maxPrompts: 40, maxEstimatedTokens: 2_000, maxBodyBytes: 64 * 1024, maxRunningPerKey: 2, longPollsPerKey: 1, longPollsTotal: 8, leaseMs: 2_000 },
    },
    { chaosEngines: true },
  );
  doc = await json(await fetch(`${gw.url}/openapi.json`));
});
it.after(async () => {
  await gw?.stop();
  rmSync(storage, { recursive: true, force: true });
});

const submit = (body: unknown, key = gw.apiKey) =>
  fetch(`${gw.url}/v1/harvest`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
const read = (id: string, query = '', key = gw.apiKey) => fetch(`${gw.url}/v1/harvest/${id}${query}`, { headers: { authorization: `Bearer ${key}` } });
const chaos = (body: unknown) =>
  fetch(`${gw.engineUrls.get('ref-byte')}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }).then((r) => assert.is(r.status, 200));

async function expectError(res: Response, status: number, code: string): Promise<any> {
  const body = await json(res);
  assert.is(res.status, status, JSON.stringify(body));
  assert.is(body.error.code, code, JSON.stringify(body));
  assert.ok(res.headers.get('x-request-id'));
  return body;
}

async function finished(id: string, key = gw.apiKey): Promise<any> {
  return until(`job ${id} to end`, async () => {
    const job = await json(await read(id, '?wait=10', key));
    return ['succeeded', 'failed', 'cancelled'].includes(job.status) ? job : null;
  });
}

const bf16 = (h: number) => new Float32Array(Uint32Array.of(h << 16).buffer)[0];
const prompts = ['The quick brown fox', 'jumps over', 'the lazy dog', 'and runs away', 'again'];

it('a job runs to success: shards of shard_size prompts, each prompt bf16 [layers, tokens, d_model] with its token ids, hashes that match', async () => {
  const res = await submit({ model: 'ref-byte', prompts, layers: [2, 0], shard_size: 2, batch_size: 2 });
  const accepted = await json(res);
  assert.is(res.status, 202, JSON.stringify(accepted));
  assert.match(accepted.id, /^hj_[0-9a-z]{24}$/);
  assert.is(accepted.job_id, accepted.id);
  assert.ok(['pending', 'running'].includes(accepted.status));
  assertDocumented(doc, 'post', '/v1/harvest', res);

  const job = await finished(accepted.id);
  assert.is(job.status, 'succeeded', JSON.stringify(job.error));
  assertDocumented(doc, 'get', '/v1/harvest/{job_id}', await read(job.id));
  assert.equal(job.layers, [0, 2]);
  assert.equal(job.progress.shards_total, 3);
  assert.equal(job.progress.shards_done, 3);
  assert.is(job.progress.prompts_done, prompts.length);
  const manifest = job.result.manifest;
  assert.is(manifest.job_id, job.id);
  assert.equal(manifest.layers, [0, 2]);
  assert.is(manifest.dtype, 'bf16');
  assert.is(manifest.shards.length, 3);

  const tokenizer = gw.registry.tokenizer('ref-byte');
  let tokens = 0;
  const rows: number[][][] = [[], []]; // per layer, each counted token's values (position 0 left out)
  for (const shard of job.result.shards) {
    const file = await fetch(`${gw.url}${shard.url}`, { headers: gw.authHeaders() });
    assert.is(file.status, 200);
    const bytes = Buffer.from(await file.arrayBuffer());
    assert.is(Number(file.headers.get('content-length')), bytes.length);
    assert.is(bytes.length, shard.bytes);
    const sha = createHash('sha256').update(bytes).digest('hex');
    assert.is(sha, shard.sha256);
    assert.is(file.headers.get('x-svc-sha256'), sha);
    assertDocumented(doc, 'get', '/v1/harvest/{job_id}/shards/{n}', file);
    const parsed = readSafetensors(bytes);
    for (let i = shard.first_prompt; i < shard.first_prompt + shard.prompt_count; i++) {
      const ids = tokenizer.encode(prompts[i], true);
      const tok = parsed.tensors[`tokens_${i}`];
      assert.is(tok.dtype, 'I32');
      assert.equal(tok.shape, [ids.length]);
      assert.equal([...new Int32Array(tok.data.buffer.slice(tok.data.byteOffset, tok.data.byteOffset + tok.data.length))], ids);
      const act = parsed.tensors[`prompt_${i}`];
      assert.is(act.dtype, 'BF16');
      assert.equal(act.shape, [2, ids.length, 64]);
      assert.is(act.data.length, 2 * ids.length * 64 * 2);
      const halves = new Uint16Array(act.data.buffer.slice(act.data.byteOffset, act.data.byteOffset + act.data.length));
      for (let l = 0; l < 2; l++) for (let t = 1; t < ids.length; t++) rows[l].push(Array.from({ length: 64 }, (_, d) => bf16(halves[(l * ids.length + t) * 64 + d])));
      tokens += ids.length;
    }
  }
  assert.is(job.progress.tokens_done, tokens);

  // The statistics: stats.safetensors downloaded like a shard, against the shards' own values in float64.
  assert.equal(job.result.stats, { url: `/v1/harvest/${job.id}/stats`, file: 'stats.safetensors', bytes: manifest.stats.bytes, sha256: manifest.stats.sha256 });
  const statsRes = await fetch(`${gw.url}${job.result.stats.url}`, { headers: gw.authHeaders() });
  assert.is(statsRes.status, 200);
  assertDocumented(doc, 'get', '/v1/harvest/{job_id}/stats', statsRes);
  const statsBytes = Buffer.from(await statsRes.arrayBuffer());
  assert.is(createHash('sha256').update(statsBytes).digest('hex'), manifest.stats.sha256);
  assert.is(statsRes.headers.get('x-svc-sha256'), manifest.stats.sha256);
  const stats = readSafetensors(statsBytes).tensors;
  const n = rows[0].length;
  assert.is(manifest.stats.token_count, n);
  assert.is(n, tokens - prompts.length, 'every token but each prompt’s first');
  assert.equal([...new Int32Array(Uint8Array.from(stats.layer_indices.data).buffer)], [0, 2]);
  const mean = new Float32Array(Uint8Array.from(stats.mean.data).buffer);
  const std = new Float32Array(Uint8Array.from(stats.std.data).buffer);
  assert.equal(stats.mean.shape, [2, 64]);
  for (let l = 0; l < 2; l++) {
    for (let d = 0; d < 64; d++) {
      const m = rows[l].reduce((a, r) => a + r[d], 0) / n;
      const sd = Math.sqrt(rows[l].reduce((a, r) => a + (r[d] - m) ** 2, 0) / n);
      assert.ok(Math.abs(mean[l * 64 + d] - m) <= 1e-6 * Math.max(Math.abs(m), sd), `mean of layer ${l}, dimension ${d}`);
      assert.ok(Math.abs(std[l * 64 + d] - sd) <= 1e-6 * sd, `std of layer ${l}, dimension ${d}`);
    }
    const norm = rows[l].reduce((a, r) => a + Math.hypot(...r), 0) / n;
    assert.ok(Math.abs(manifest.stats.mean_token_norm[l] - norm) <= 1e-9 * norm, `mean token norm of layer ${l}`);
  }
});

it('the shard bytes are the engine capture of the same prompt (layers 0 and 2 of a completion capture)', async () => {
  const prompt = 'Activations, please';
  const res = await submit({ model: 'ref-byte', prompts: [prompt], layers: [0, 2] });
  const job = await finished((await json(res)).id);
  assert.is(job.status, 'succeeded');
  const file = Buffer.from(await (await fetch(`${gw.url}${job.result.shards[0].url}`, { headers: gw.authHeaders() })).arrayBuffer());
  const harvested = readSafetensors(file).tensors.prompt_0;
  const ids = gw.registry.tokenizer('ref-byte').encode(prompt, true);
  const captured = await json(
    await fetch(`${gw.url}/v1/completions`, {
      method: 'POST',
      headers: { ...gw.authHeaders(), 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'ref-byte', prompt: ids, max_tokens: 1, temperature: 0, output_residual_stream: [0, 2] }),
    }),
  );
  const rs = captured.activations.residual_stream;
  assert.equal(rs.shape, [2, ids.length, 64]);
  assert.ok(Buffer.from(rs.data, 'base64').equals(Buffer.from(harvested.data)), 'the shard holds the capture bytes as the engine sent them');
});

it('submit checks answer in the envelope: 413 before the body, caps and schema 400, activations_unsupported', async () => {
  // 413 from the declared length alone: the body is never sent.
  const status = await new Promise<{ status: number; body: string }>((resolve, reject) => {
    const url = new URL(`${gw.url}/v1/harvest`);
    const req = httpRequest({ host: url.hostname, port: url.port, path: url.pathname, method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json', 'content-length': String(10 * 1024 * 1024) } }, (res) => {
      let body = '';
      res.on('data', (c) => (body += c));
      res.on('end', () => resolve({ status: res.statusCode!, body }));
    });
    req.on('error', reject);
    req.flushHeaders();
  });
  assert.is(status.status, 413);
  assert.is(JSON.parse(status.body).error.code, 'request_too_large');

  await expectError(await submit({ model: 'ref-byte', prompts: Array.from({ length: 41 }, () => 'x') }), 400, 'invalid_request');
  const tooLong = await expectError(await submit({ model: 'ref-byte', prompts: ['y'.repeat(8_004)] }), 400, 'invalid_request');
  assert.match(tooLong.error.message, /2000/);
  await expectError(await submit({ model: 'ref-byte', prompts: ['a'], extra: 1 }), 400, 'invalid_request');
  await expectError(await submit({ model: 'ref-byte', prompts: [] }), 400, 'invalid_request');
  await expectError(await submit({ model: 'ref-byte', prompts: [''] }), 400, 'invalid_request');
  await expectError(await submit({ model: 'ref-byte', prompts: 'a' }), 400, 'invalid_request');
  await expectError(await submit({ prompts: ['a'] }), 400, 'invalid_request');
  await expectError(await submit({ model: 'ref-byte', prompts: ['a'], layers: Array.from({ length: 257 }, (_, i) => i) }), 400, 'invalid_request');
  await expectError(await submit({ model: 'ref-byte', prompts: ['a'], layers: 'some' }), 400, 'invalid_request');
  await expectError(await submit({ model: 'ref-byte', prompts: ['a'], layers: [4] }), 400, 'invalid_request');
  await expectError(await submit({ model: 'ref-byte', prompts: ['a'], layers: [-1] }), 400, 'invalid_request');
  await expectError(await submit({ model: 'ref-byte', prompts: ['a'], shard_size: 0 }), 400, 'invalid_request');
  await expectError(await submit({ model: 'ref-byte', prompts: ['a'], shard_size: 4097 }), 400, 'invalid_request');
  await expectError(await submit({ model: 'ref-byte', prompts: ['a'], batch_size: 65 }), 400, 'invalid_request');
  await expectError(await submit({ model: 'ref-byte', prompts: ['a'], batch_size: 1.5 }), 400, 'invalid_request');
  await expectError(await submit({ model: 'no-such-model', prompts: ['a'] }), 400, 'model_not_found');
  await expectError(
    await fetch(`${gw.url}/v1/harvest`, { method: 'POST', headers: gw.authHeaders({ 'content-type': 'application/json' }), body: '{"model": ' }),
    400,
    'bad_json',
  );
  await expectError(await fetch(`${gw.url}/v1/harvest`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' }), 401, 'invalid_api_key');
  // Nothing was recorded for any of them.
  const list = await json(await fetch(`${gw.url}/v1/harvest`, { headers: gw.authHeaders() }));
  await gw.projectionsCaughtUp();
  assert.ok(list.data.every((j: { status: string }) => j.status === 'succeeded'));
});

it('jobs are visible to keys of the same user only; an unknown id is the same 404', async () => {
  const res = await submit({ model: 'ref-byte', prompts: ['mine'] });
  const id = (await json(res)).id;
  const sameUser = await issueKey(gw.url, gw.adminToken, { email: 'tests@example.org' });
  const otherUser = await issueKey(gw.url, gw.adminToken, { email: 'someone-else@example.org' });
  assert.is((await read(id, '', sameUser)).status, 200);
  const other = await expectError(await read(id, '', otherUser), 404, 'harvest_job_not_found');
  const unknown = await expectError(await read('hj_000000000000000000000000'), 404, 'harvest_job_not_found');
  const malformed = await expectError(await read('..%2Fetc'), 404, 'harvest_job_not_found');
  assert.is(other.error.message.replace(id, 'X'), unknown.error.message.replace('hj_000000000000000000000000', 'X'));
  assert.ok(malformed);
  await expectError(await fetch(`${gw.url}/v1/harvest/${id}/shards/0`, { headers: { authorization: `Bearer ${otherUser}` } }), 404, 'harvest_job_not_found');
  await expectError(await fetch(`${gw.url}/v1/harvest/${id}`, { method: 'DELETE', headers: { authorization: `Bearer ${otherUser}` } }), 404, 'harvest_job_not_found');
  const job = await finished(id);
  assert.is(job.status, 'succeeded');
  await expectError(await fetch(`${gw.url}/v1/harvest/${id}/shards/1`, { headers: gw.authHeaders() }), 404, 'harvest_shard_not_found');
  await gw.projectionsCaughtUp();
  const listed = await json(await fetch(`${gw.url}/v1/harvest`, { headers: { authorization: `Bearer ${sameUser}` } }));
  assert.ok(listed.data.some((j: { id: string }) => j.id === id));
  const notListed = await json(await fetch(`${gw.url}/v1/harvest`, { headers: { authorization: `Bearer ${otherUser}` } }));
  assert.equal(notListed.data, []);
});

it('?wait is 0-60 seconds; a long-poll over the cap is answered at once, declined, with Retry-After', async () => {
  await chaos({ mode: 'delay', count: 1000, delay_ms: 400 });
  try {
    const id = (await json(await submit({ model: 'ref-byte', prompts: ['slow one', 'slow two', 'slow three'], shard_size: 1, batch_size: 1 }))).id;
    await expectError(await read(id, '?wait=61'), 400, 'invalid_request');
    await expectError(await read(id, '?wait=abc'), 400, 'invalid_request');
    await expectError(await read(id, '?wait=-1'), 400, 'invalid_request');
    const first = read(id, '?wait=20');
    await new Promise((r) => setTimeout(r, 100));
    const started = Date.now();
    const second = await read(id, '?wait=20');
    assert.ok(Date.now() - started < 10_000, 'declined at once, not after the 20 s wait');
    assert.is(second.status, 200);
    assert.is(second.headers.get('x-svc-longpoll'), 'declined');
    assertDocumented(doc, 'get', '/v1/harvest/{job_id}', second);
    assert.ok(Number(second.headers.get('retry-after')) > 0);
    const body = await json(second);
    assert.ok(['pending', 'running'].includes(body.status));
    // The waiting one returns as soon as the job moves (a shard written), well before its 20 s.
    const moved = await json(await first);
    assert.ok(moved.progress.shards_done >= 1 || moved.status !== 'running');
    await finished(id);
  } finally {
    await chaos({ mode: 'none' });
  }
});

it('a running job is cancelled once (then 409); the running cap refuses a third job with Retry-After', async () => {
  await chaos({ mode: 'delay', count: 1000, delay_ms: 300 });
  try {
    const slow = { model: 'ref-byte', prompts: Array.from({ length: 20 }, (_, i) => `prompt ${i}`), shard_size: 1, batch_size: 1 };
    const a = (await json(await submit(slow))).id;
    const b = (await json(await submit(slow))).id;
    const refused = await submit(slow);
    const body = await expectError(refused, 429, 'harvest_concurrency_exceeded');
    assertDocumented(doc, 'post', '/v1/harvest', refused);
    assert.ok(Number(refused.headers.get('retry-after')) > 0);
    assert.ok(body.error.message.length > 0);
    for (const id of [a, b]) {
      const cancel = await fetch(`${gw.url}/v1/harvest/${id}`, { method: 'DELETE', headers: gw.authHeaders() });
      const cancelled = await json(cancel);
      assert.is(cancel.status, 200, JSON.stringify(cancelled));
      assert.is(cancelled.status, 'cancelled');
      await expectError(await fetch(`${gw.url}/v1/harvest/${id}`, { method: 'DELETE', headers: gw.authHeaders() }), 409, 'harvest_not_cancellable');
    }
    // The slots are free again at once.
    const c = await submit({ model: 'ref-byte', prompts: ['after the cancels'] });
    assert.is(c.status, 202);
    await chaos({ mode: 'none' });
    assert.is((await finished((await json(c)).id)).status, 'succeeded');
    // A cancelled job stays cancelled: its worker stopped, nothing overwrote it.
    await new Promise((r) => setTimeout(r, 500));
    assert.is((await json(await read(a))).status, 'cancelled');
  } finally {
    await chaos({ mode: 'none' });
  }
});

it("the key's monthly job quota refuses the job over it (429, Retry-After to the next month); 0 is unlimited", async () => {
  const limited = await issueKey(gw.url, gw.adminToken, { email: 'quota@example.org', monthly_harvest_jobs: 1 });
  const first = await submit({ model: 'ref-byte', prompts: ['one'] }, limited);
  assert.is(first.status, 202);
  const over = await submit({ model: 'ref-byte', prompts: ['two'] }, limited);
  const body = await expectError(over, 429, 'harvest_quota_exceeded');
  assert.ok(Number(over.headers.get('retry-after')) > 60);
  assert.ok(body.error.message.length > 0);
  const unlimited = await issueKey(gw.url, gw.adminToken, { email: 'zero@example.org', monthly_harvest_jobs: 0 });
  for (let i = 0; i < 2; i++) assert.is((await submit({ model: 'ref-byte', prompts: ['z'] }, unlimited)).status, 202);
});

it('harvest tokens are metered on the key: its usage grows by the prompts harvested', async () => {
  const key = await issueKey(gw.url, gw.adminToken, { email: 'metered@example.org' });
  const prefix = key.split('_')[1];
  const usage = async () => (await json(await fetch(`${gw.url}/admin/keys/${prefix}`, { headers: gw.adminHeaders() }))).usage?.total_tokens ?? 0;
  const before = await usage();
  const job = await finished((await json(await submit({ model: 'ref-byte', prompts: ['count', 'these tokens'], batch_size: 2 }, key))).id, key);
  assert.is(job.status, 'succeeded');
  await gw.projectionsCaughtUp();
  const after = await until('the usage to show', async () => {
    await gw.projectionsCaughtUp();
    const now = await usage();
    return now > before ? now : null;
  });
  // Prompt tokens plus one generated token per prompt (max_tokens 1).
  assert.is(after - before, job.progress.tokens_done + 2);
});

it.run();
