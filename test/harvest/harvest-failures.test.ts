/**
 * Harvests that cannot finish, through real HTTP: an engine that keeps failing fails the job after a
 * bounded number of attempts with the engine's code and a message naming the prompt; a prompt the
 * engine refuses (a client error) fails it at once; a job with no progress for the stale window is
 * aged out by its key's next submit, which then takes the freed slot (and the stuck worker stops);
 * and `svc harvest download` refuses a shard whose bytes do not match their recorded hash.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { loadSettings } from '../../src/config/index.ts';
import { harvestCommand } from '../../src/cli/harvest.ts';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';
import { until } from '../support/until.ts';

const it = suite('harvests that fail');
const storage = mkdtempSync(join(tmpdir(), 'svc-harvest-fail-'));
const defaults = loadSettings({ ...process.env, DATABASE_URL: '', SVC_HARVEST_DIR: storage }).harvest;
let gw: TestGateway;

it.before(async () => {
  gw = await startTestGateway({ harvest: { ...defaults, maxRunningPerKey: 1, staleAfterMs: 1_500, leaseMs: 1_500 } }, { chaosEngines: true });
});
it.after(async () => {
  await gw?.stop();
  rmSync(storage, { recursive: true, force: true });
});

const submit = (body: unknown) => fetch(`${gw.url}/v1/harvest`, { method: 'POST', headers: gw.authHeaders({ 'content-type': 'application/json' }), body: JSON.stringify(body) });
const read = (id: string, query = '') => fetch(`${gw.url}/v1/harvest/${id}${query}`, { headers: gw.authHeaders() });
const chaos = (body: unknown) =>
  fetch(`${gw.engineUrls.get('ref-byte')}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) }).then((r) => assert.is(r.status, 200));
const ended = (id: string) =>
  until(`job ${id} to end`, async () => {
    const job = await json(await read(id, '?wait=10'));
    return ['succeeded', 'failed', 'cancelled'].includes(job.status) ? job : null;
  });

it('an engine that keeps failing fails the job after bounded attempts, with its code and the prompt', async () => {
  await chaos({ mode: 'error500', count: 1_000 });
  try {
    const started = Date.now();
    const res = await submit({ model: 'ref-byte', prompts: ['doomed'] });
    assert.is(res.status, 202);
    const job = await ended((await json(res)).id);
    assert.is(job.status, 'failed');
    assert.is(job.error.code, 'upstream_server_error');
    assert.match(job.error.message, /^prompt 0: .*after 4 attempts/);
    assert.ok(Date.now() - started < 120_000, 'failed after its attempts, not waiting out a lease or the stale-job age');
  } finally {
    await chaos({ mode: 'none' });
  }
});

it('a prompt longer than the model allows fails the job at once, naming the prompt', async () => {
  const res = await submit({ model: 'ref-gpt2', prompts: ['fine', 'word '.repeat(3_000)], batch_size: 1 });
  assert.is(res.status, 202);
  const job = await ended((await json(res)).id);
  assert.is(job.status, 'failed');
  assert.match(job.error.message, /^prompt 1: /);
  assert.ok(['context_length_exceeded', 'activation_prompt_too_long'].includes(job.error.code), job.error.code);
});

it('a job with no progress for the stale window is aged out by the next submit, which takes its slot', async () => {
  await chaos({ mode: 'hang', count: 1_000 });
  try {
    const stuck = (await json(await submit({ model: 'ref-byte', prompts: ['hangs'] }))).id;
    await new Promise((r) => setTimeout(r, 1_800));
    await chaos({ mode: 'none' });
    const next = await submit({ model: 'ref-byte', prompts: ['goes through'] });
    assert.is(next.status, 202, await next.clone().text());
    // The admission freed the stale job's slot, and the submit aged the job out before its answer.
    const aged = await json(await read(stuck));
    assert.is(aged.status, 'failed');
    assert.is(aged.error.code, 'stale');
    assert.is((await ended((await json(next)).id)).status, 'succeeded');
    // The stale job's worker stopped: it never overwrote the failure.
    await new Promise((r) => setTimeout(r, 500));
    assert.is((await json(await read(stuck))).status, 'failed');
  } finally {
    await chaos({ mode: 'none' });
  }
});

it('a capture that outlasts the request window fails the job with upstream_deadline (its worker does not hang)', async () => {
  const short = await startTestGateway({ requestWindowMs: 800, harvest: { ...defaults, storageDir: join(storage, 'short') } }, { chaosEngines: true });
  try {
    const hang = await fetch(`${short.engineUrls.get('ref-byte')}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: 'hang', count: 1_000 }) });
    assert.is(hang.status, 200);
    const res = await fetch(`${short.url}/v1/harvest`, { method: 'POST', headers: short.authHeaders({ 'content-type': 'application/json' }), body: JSON.stringify({ model: 'ref-byte', prompts: ['never answered'] }) });
    const id = (await json(res)).id;
    const job = await until('the job to fail', async () => {
      const j = await json(await fetch(`${short.url}/v1/harvest/${id}?wait=5`, { headers: short.authHeaders() }));
      return j.status === 'failed' ? j : null;
    });
    assert.is(job.error.code, 'upstream_deadline');
    assert.match(job.error.message, /^prompt 0: the engine did not answer within 1 s/);
  } finally {
    await short.stop();
  }
});

it('svc harvest download verifies every shard and the statistics: a corrupted one is refused, and nothing of it kept', async () => {
  const res = await submit({ model: 'ref-byte', prompts: ['one', 'two'], shard_size: 1 });
  const job = await ended((await json(res)).id);
  assert.is(job.status, 'succeeded');
  const io = () => {
    let out = '';
    let err = '';
    const sink = (add: (s: string) => void) => new Writable({ write: (c, _e, cb) => (add(String(c)), cb()) });
    return { env: { SVC_URL: gw.url, SVC_API_KEY: gw.apiKey }, stdout: sink((s) => (out += s)), stderr: sink((s) => (err += s)), out: () => out, err: () => err };
  };
  const good = mkdtempSync(join(tmpdir(), 'svc-dl-'));
  const bad = mkdtempSync(join(tmpdir(), 'svc-dl-'));
  try {
    const first = io();
    assert.is(await harvestCommand(['download', job.id, good], first), 0, first.err());
    assert.equal(readdirSync(good).sort(), [...job.result.shards.map((s: { file: string }) => s.file), 'manifest.json', 'stats.safetensors'].sort());
    assert.ok(readFileSync(join(good, 'stats.safetensors')).equals(readFileSync(join(storage, job.id, 'stats.safetensors'))), 'the statistics as stored');
    assert.is(JSON.parse(readFileSync(join(good, 'manifest.json'), 'utf8')).job_id, job.id);
    // Corrupt the second shard where it is stored.
    const file = join(storage, job.id, job.result.shards[1].file);
    const bytes = readFileSync(file);
    bytes[bytes.length - 1] ^= 0xff;
    writeFileSync(file, bytes);
    const second = io();
    assert.is(await harvestCommand(['download', job.id, bad], second), 1);
    assert.match(second.err(), /SHA-256 .* does not match/);
    assert.not.ok(existsSync(join(bad, job.result.shards[1].file)));
    assert.not.ok(existsSync(join(bad, 'manifest.json')), 'no manifest beside an incomplete download');
    // A corrupted statistics file is refused the same way.
    writeFileSync(file, readFileSync(join(good, job.result.shards[1].file)));
    const stats = join(storage, job.id, 'stats.safetensors');
    const statsBytes = readFileSync(stats);
    statsBytes[statsBytes.length - 1] ^= 0xff;
    writeFileSync(stats, statsBytes);
    const third = io();
    rmSync(bad, { recursive: true, force: true });
    assert.is(await harvestCommand(['download', job.id, bad], third), 1);
    assert.match(third.err(), /stats\.safetensors: SHA-256 .* does not match/);
    assert.not.ok(existsSync(join(bad, 'stats.safetensors')));
    assert.not.ok(existsSync(join(bad, 'manifest.json')));
  } finally {
    rmSync(good, { recursive: true, force: true });
    rmSync(bad, { recursive: true, force: true });
  }
});

it.run();
