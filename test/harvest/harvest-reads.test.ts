/**
 * Harvest reads through real HTTP on a gateway with no harvest worker (`workers: 0`), so a job stays
 * where the test puts it: the test plays a worker that died between writing a job's manifest and
 * recording its success (claim, shard recorded, manifest stored). The poll that finds that outcome
 * records it and serves it, a declined long-poll included; and the submit's token estimate counts
 * characters (code points), not UTF-16 units.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadSettings } from '../../src/config/index.ts';
import { fileHarvestStorage } from '../../src/harvest/index.ts';
import { buildManifest } from '../../src/harvest/manifest.ts';
import { harvestEvents, harvestStream } from '../../events/harvest.ts';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';
import { until } from '../support/until.ts';

const it = suite('harvest reads without a worker');
const storageDir = mkdtempSync(join(tmpdir(), 'svc-harvest-reads-'));
const models = loadSettings().models.filter((m) => m.id === 'ref-byte');
const defaults = loadSettings({ ...process.env, DATABASE_URL: '', SVC_HARVEST_DIR: storageDir }).harvest;
let gw: TestGateway;

it.before(async () => {
  gw = await startTestGateway({
    models,
    harvest: { ...defaults, workers: 0, maxEstimatedTokens: 2_000, maxRunningPerKey: 10, longPollsPerKey: 1, longPollsTotal: 8 },
  });
});
it.after(async () => {
  await gw?.stop();
  rmSync(storageDir, { recursive: true, force: true });
});

const submit = (body: unknown) => fetch(`${gw.url}/v1/harvest`, { method: 'POST', headers: gw.authHeaders({ 'content-type': 'application/json' }), body: JSON.stringify(body) });
const read = (id: string, query = '') => fetch(`${gw.url}/v1/harvest/${id}${query}`, { headers: gw.authHeaders() });

async function running(prompts: string[]): Promise<string> {
  const res = await submit({ model: 'ref-byte', prompts, layers: [0] });
  const body = await json(res);
  assert.is(res.status, 202, JSON.stringify(body));
  return body.id;
}

/** A worker that claimed the job, wrote and recorded its one shard and its manifest, then died before recording success. */
async function diedBeforeSuccess(id: string): Promise<string> {
  const now = () => new Date().toISOString();
  const claimed = await gw.harvests.command(id, { type: 'Claim', claimId: 'claim-of-the-dead-worker', workerId: 'gone', leaseMs: 600_000, now: now() });
  assert.ok(claimed.accepted);
  const record = { shard: 0, file: 'shard-00000-deadworker.safetensors', first_prompt: 0, prompt_count: 1, token_count: 5, bytes: 1_000, sha256: 'a'.repeat(64) };
  const recorded = await gw.harvests.command(id, { type: 'RecordShard', claimId: 'claim-of-the-dead-worker', leaseMs: 600_000, record, now: now() });
  assert.ok(recorded.accepted);
  const written = await fileHarvestStorage(storageDir).writeManifest(id, buildManifest(await gw.harvests.state(id)));
  return written.sha256;
}

async function succeededEvents(id: string): Promise<number> {
  await gw.commands.settled();
  return (await gw.store.readStream(harvestStream(id))).events.map((e) => harvestEvents.parse(e)).filter((e) => e.type === 'HarvestSucceeded').length;
}

it('the poll that finds the outcome serves it: the job succeeded, with its manifest', async () => {
  const id = await running(['finished, never recorded']);
  const manifestSha = await diedBeforeSuccess(id);
  const res = await read(id);
  assert.is(res.status, 200);
  const job = await json(res);
  assert.is(job.status, 'succeeded', 'the state after the outcome the poll recorded, not the one before it');
  assert.is(job.result.manifest_sha256, manifestSha);
  assert.is(job.result.shards.length, 1);
  assert.is(await succeededEvents(id), 1);
});

it('a declined long-poll reconciles its job too, and serves the outcome', async () => {
  const waitedOn = await running(['keeps running']);
  const id = await running(['finished, never recorded']);
  await diedBeforeSuccess(id);
  // The key's one long-poll place, taken until its job is cancelled below.
  const holder = read(waitedOn, '?wait=60');
  await until('the long-poll place to be taken', async () => (await read(waitedOn, '?wait=1')).headers.get('x-svc-longpoll') === 'declined', 20_000, 50);
  const res = await read(id, '?wait=30');
  assert.is(res.headers.get('x-svc-longpoll'), 'declined');
  const job = await json(res);
  assert.is(job.status, 'succeeded');
  assert.is(await succeededEvents(id), 1);
  assert.is((await fetch(`${gw.url}/v1/harvest/${waitedOn}`, { method: 'DELETE', headers: gw.authHeaders() })).status, 200);
  assert.is((await json(await holder)).status, 'cancelled');
});

it('the estimated tokens count characters (code points): an emoji is one character, not two UTF-16 units', async () => {
  // 8,000 emoji: 8,000 characters, 2,000 estimated tokens, at the cap (16,000 UTF-16 units would be 4,000).
  const atCap = await submit({ model: 'ref-byte', prompts: ['🙂'.repeat(8_000)], layers: [0] });
  assert.is(atCap.status, 202, JSON.stringify(await json(atCap.clone())));
  const id = (await json(atCap)).id;
  await fetch(`${gw.url}/v1/harvest/${id}`, { method: 'DELETE', headers: gw.authHeaders() }).then((r) => r.arrayBuffer());
  const over = await submit({ model: 'ref-byte', prompts: ['🙂'.repeat(4_000), '🙂'.repeat(4_001)], layers: [0] });
  const body = await json(over);
  assert.is(over.status, 400);
  assert.is(body.error.code, 'invalid_request');
  assert.match(body.error.message, /about 2001 tokens/);
});

it.run();
