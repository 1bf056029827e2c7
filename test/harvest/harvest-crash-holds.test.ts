/**
 * A gateway SIGKILLed in the middle of a harvest while its key's 16 active slots are all taken there
 * (the harvest's batches and long completions), then started again on the same store: on the
 * embedded store (the same DATA_DIR) and on PostgreSQL (skipped without DATABASE_URL).
 *
 * - The resumed job never meets its predecessor's reservations (each claim reserves its batches
 *   under request ids of its own), so it finishes, every shard recorded once.
 * - The dead process's holds are tied to its slot lease: once that lapses the reaper expires them,
 *   so the key's next 16 concurrent requests are served, not queued for the reservation TTL (20
 *   minutes, left at its default here; the slot lease is shortened to keep the test short).
 * - Nothing is charged twice or left open: every reservation on the key's meter ends once, settled
 *   or expired.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startHarvestStack, crash, type HarvestStack } from '../support/harvest-stack.ts';
import { postgresUnavailable } from '../support/postgres.ts';
import { issueKey, json } from '../support/gateway.ts';
import { seriesValue } from '../support/metrics.ts';
import { until } from '../support/until.ts';
import { harvestEvents, harvestStream } from '../../events/harvest.ts';
import { meterEvents, meterStream, utcDay } from '../../events/meter.ts';
import { meterDecider } from '../../deciders/meter.ts';

const databaseUrl = process.env.DATABASE_URL;
const variants = [
  { name: 'embedded store, same DATA_DIR', postgres: null as string | null, unavailable: null as string | null },
  { name: 'PostgreSQL', postgres: databaseUrl ?? null, unavailable: await postgresUnavailable(databaseUrl) },
];

for (const variant of variants) {
  const it = suite(`a harvest killed with its key's slots taken (${variant.name})`);
  if (variant.unavailable) {
    it.skip(`PostgreSQL variant: ${variant.unavailable}`, () => {});
    it.run();
    continue;
  }
  let stack: HarvestStack;
  it.before(async () => {
    stack = await startHarvestStack({
      name: 'harvest-crash',
      postgres: variant.postgres,
      env: { SVC_HARVEST_LEASE_MS: '5000', SVC_SLOT_LEASE_MS: '3000' },
    });
  });
  it.after(async () => {
    await stack?.stop();
  });

  it('the job resumes and finishes, each shard once; the key serves 16 concurrent requests; every hold ends once', async () => {
    const first = await stack.serve();
    const key = await issueKey(first.url, stack.adminToken, { email: 'crash@example.org' });
    const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
    const admin = { authorization: `Bearer ${stack.adminToken}` };
    await stack.chaos({ mode: 'delay', count: 1_000_000, delay_ms: 40 });
    const prompts = Array.from({ length: 1200 }, (_, i) => `harvest prompt ${i}`);
    const submitted = await fetch(`${first.url}/v1/harvest`, { method: 'POST', headers, body: JSON.stringify({ model: 'ref-byte', prompts, layers: [1], shard_size: 100, batch_size: 4 }) });
    assert.is(submitted.status, 202);
    const id = (await json(submitted)).id as string;
    await until('two shards written', async () => (await json(await fetch(`${first.url}/v1/harvest/${id}?wait=5`, { headers }))).progress.shards_done >= 2, 120_000);

    // Long completions take every slot the harvest does not: once requests queue, all 16 are taken (a
    // request queues only on a refusal decided on what the store holds).
    const dying = new AbortController();
    const long = Array.from({ length: 20 }, () =>
      fetch(`${first.url}/v1/completions`, { method: 'POST', headers, body: JSON.stringify({ model: 'ref-byte', prompt: 'long', max_tokens: 2000, stream: true }), signal: dying.signal }).catch(() => null),
    );
    await until(
      "the key's 16 slots taken in the first gateway, requests queued",
      async () => {
        const text = await (await fetch(`${first.url}/metrics`, { headers: admin })).text();
        return (seriesValue(text, 'svc_requests_active') ?? 0) >= 16 && (seriesValue(text, 'svc_requests_queued') ?? 0) >= 1;
      },
      60_000,
    );
    await crash(first.child);
    dying.abort();
    await Promise.all(long);
    await stack.chaos({ mode: 'none' });

    const second = await stack.serve();
    // The key's next 16 concurrent requests, sent at once: served (each waits at most for the dead lease to lapse).
    const serving = Promise.all(
      Array.from({ length: 16 }, async () => {
        const res = await fetch(`${second.url}/v1/completions`, {
          method: 'POST',
          headers,
          body: JSON.stringify({ model: 'ref-byte', prompt: 'after the crash', max_tokens: 4 }),
          signal: AbortSignal.timeout(90_000),
        }).catch((error: Error) => ({ status: error.name }) as const);
        if ('arrayBuffer' in res) await res.arrayBuffer();
        return res.status;
      }),
    );
    const done = await until(
      'the job to end on the restarted gateway',
      async () => {
        const job = await json(await fetch(`${second.url}/v1/harvest/${id}?wait=5`, { headers }));
        return job.status === 'running' || job.status === 'pending' ? null : job;
      },
      180_000,
    );
    const served = await serving;
    assert.is(done.status, 'succeeded', JSON.stringify(done.error));
    assert.is(done.progress.shards_done, 12);
    assert.equal(served, Array(16).fill(200), 'all 16 served');
    second.child.kill('SIGTERM');
    await new Promise((r) => second.child.once('exit', r));

    const store = await stack.openStore();
    const events = (await store.readStream(harvestStream(id))).events.map((e) => harvestEvents.parse(e));
    const written = events.filter((e) => e.type === 'HarvestShardWritten').map((e) => (e.data as { shard: number }).shard);
    assert.equal(written, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], 'each shard recorded once, in order');
    const claims = events.filter((e) => e.type === 'HarvestClaimed').map((e) => e.data as { next_shard: number });
    assert.is(claims.length, 2, 'one claim before the crash, one after');

    // Every reservation on the key's meter ended once: settled, or expired (the dead process's).
    const keyId = key.split('_')[1];
    const meter = (await store.readStream(meterStream(keyId, utcDay(new Date())))).events.map((e) => meterEvents.parse(e));
    const state = meter.reduce(meterDecider.evolve, meterDecider.initialState());
    assert.is(state.holds.size, 0, 'no hold left open');
    const ends = new Map<string, string[]>();
    for (const e of meter) {
      if (e.type !== 'UsageSettled' && e.type !== 'ReservationExpired') continue;
      const requestId = (e.data as { request_id: string }).request_id;
      ends.set(requestId, [...(ends.get(requestId) ?? []), e.type]);
    }
    const reserved = meter.filter((e) => e.type === 'BudgetReserved').map((e) => (e.data as { request_id: string }).request_id);
    assert.is(new Set(reserved).size, reserved.length, 'no request id reserved twice');
    for (const requestId of reserved) assert.is(ends.get(requestId)?.length, 1, `${requestId} ended once`);
    assert.ok(meter.filter((e) => e.type === 'ReservationExpired').length >= 14, "the dead process's holds were expired");
    // The resumed claim reserved every batch it ran, and settled it: none ran on (or was refused for) a hold of the dead process.
    const firstHolder = (meter.find((e) => e.type === 'BudgetReserved')!.data as { lease_holder: string }).lease_holder;
    const resumed = meter.filter((e) => e.type === 'BudgetReserved' && e.data.endpoint === '/v1/harvest' && e.data.lease_holder !== firstHolder);
    assert.is(resumed.length, (12 - claims[1].next_shard) * 25, 'one reservation per batch of the resumed claim');
    for (const e of resumed) assert.equal(ends.get((e.data as { request_id: string }).request_id), ['UsageSettled']);
  });

  it.run();
}
