/**
 * A submit whose job cannot be recorded, through real HTTP: its input cannot be stored (the harvest
 * directory is not a directory: 503 `harvest_unavailable`; the harvest volume is full: 503
 * `harvest_storage_full`, with its Retry-After). The failure is recorded on the job's stream (`FailStart` on a job never
 * recorded), the slot and the month's count go back by the one release path (the quota decider's
 * rule, `reason: ended`), no file is left behind, and the key's next submit is admitted although the
 * key may run one job and submit one a month.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadSettings } from '../../src/config/index.ts';
import { harvestQuotaStream, harvestStream } from '../../events/harvest.ts';
import { issueKey, json, startTestGateway, type TestGateway } from '../support/gateway.ts';
import { until } from '../support/until.ts';

const it = suite('a harvest submit that cannot record its job');
const root = mkdtempSync(join(tmpdir(), 'svc-harvest-submit-fail-'));
const storage = join(root, 'harvests');
const defaults = loadSettings({ ...process.env, DATABASE_URL: '', SVC_HARVEST_DIR: storage }).harvest;
let gw: TestGateway;

it.before(async () => {
  mkdirSync(storage, { recursive: true });
  gw = await startTestGateway({ harvest: { ...defaults, storageDir: storage, maxRunningPerKey: 1 } });
});
it.after(async () => {
  await gw?.stop();
  rmSync(root, { recursive: true, force: true });
});

/** The job ids the gateway logged as not started, in order. */
const failedJobs = (): string[] =>
  gw
    .logs()
    .split('\n')
    .filter((line) => line.includes('harvest job could not be started'))
    .map((line) => JSON.parse(line).job_id as string);

async function failedSubmitGivesBack(key: string, expected: { status: number; code: string }) {
  const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
  const submit = () => fetch(`${gw.url}/v1/harvest`, { method: 'POST', headers, body: JSON.stringify({ model: 'ref-byte', prompts: ['x'] }) });
  const before = failedJobs().length;
  const res = await submit();
  const body = await json(res);
  assert.is(res.status, expected.status, JSON.stringify(body));
  assert.is(body.error.code, expected.code);
  assert.match(body.error.message, /does not count against your quota/);
  assert.ok(res.headers.get('retry-after'), 'retryable');
  const jobs = failedJobs();
  assert.is(jobs.length, before + 1);
  const jobId = jobs.at(-1)!;
  // Recorded as a failed start on its own stream, never submitted.
  const jobEvents = (await gw.log.readStream(harvestStream(jobId))).events;
  assert.equal(jobEvents.map((e) => e.type), ['HarvestStartFailed']);
  const keyId = (jobEvents[0]!.data as { key_id: string }).key_id;
  return { jobId, keyId, submit };
}

const releasesOf = async (keyId: string, jobId: string) =>
  (await gw.log.readStream(harvestQuotaStream(keyId))).events.filter((e) => e.type === 'HarvestSlotReleased' && (e.data as { job_id: string }).job_id === jobId).map((e) => e.data);

it('503 harvest_unavailable when the input cannot be stored: the slot and the count come back, and the next submit is admitted', async () => {
  const key = await issueKey(gw.url, gw.adminToken, { email: 'submit-503@example.org', monthly_harvest_jobs: 1 });
  rmSync(storage, { recursive: true, force: true });
  writeFileSync(storage, 'not a directory');
  let failed;
  try {
    failed = await failedSubmitGivesBack(key, { status: 503, code: 'harvest_unavailable' });
  } finally {
    rmSync(storage, { force: true });
    mkdirSync(storage, { recursive: true });
  }
  await until('the slot released', async () => (await releasesOf(failed.keyId, failed.jobId)).length > 0, 30_000, 50);
  const released = (await releasesOf(failed.keyId, failed.jobId)) as { job_id: string; counted: boolean; reason?: string }[];
  assert.equal(released.map((r) => [r.job_id, r.counted, r.reason]), [[failed.jobId, false, 'ended']], 'released once, uncounted, by the rule for an ended job');
  const next = await failed.submit();
  assert.is(next.status, 202, await next.clone().text());
  const id = (await json(next)).id;
  await fetch(`${gw.url}/v1/harvest/${id}`, { method: 'DELETE', headers: { authorization: `Bearer ${key}` } });
});

it('503 harvest_storage_full when the harvest volume is full: the slot and the count come back at once (the next admission finds the failed start), nothing is left on disk', async () => {
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=64k,mode=0700', 'tmpfs', storage], { stdio: 'pipe' });
  } catch (error) {
    console.log(`  skipped: cannot mount a tmpfs (${String((error as { stderr?: Buffer }).stderr ?? (error as Error).message).trim()})`);
    return;
  }
  const key = await issueKey(gw.url, gw.adminToken, { email: 'submit-507@example.org', monthly_harvest_jobs: 1 });
  let failed;
  try {
    // Filled to the last block.
    try {
      writeFileSync(join(storage, 'filler'), Buffer.alloc(1 << 20));
    } catch {}
    failed = await failedSubmitGivesBack(key, { status: 503, code: 'harvest_storage_full' });
    assert.equal(readdirSync(storage).filter((name) => name !== 'filler'), [], 'no folder left for the job never recorded');
  } finally {
    execFileSync('umount', ['-l', storage]);
  }
  // No wait for the workflow: the next admission reads the failed start and frees its slot itself.
  const next = await failed.submit();
  assert.is(next.status, 202, await next.clone().text());
  const released = await releasesOf(failed.keyId, failed.jobId);
  assert.is(released.length, 1, 'released once, by whichever came first');
  assert.equal([(released[0] as { counted: boolean }).counted, (released[0] as { reason: string }).reason], [false, 'ended']);
  const id = (await json(next)).id;
  await fetch(`${gw.url}/v1/harvest/${id}`, { method: 'DELETE', headers: { authorization: `Bearer ${key}` } });
});

it.run();
