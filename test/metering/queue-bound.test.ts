/**
 * The contract's "64 queued per key" across gateway processes: two `svc serve` gateways on one
 * PostgreSQL database and one reference engine. With the key's 16 active slots taken by slow
 * requests, 100 more arrive, 50 through each gateway: each process alone is under 64, so a bound
 * counted per process would queue all 100. At most 64 may wait; the rest are refused 429 queue_full,
 * and every request that waited completes once the slow ones end.
 * PostgreSQL only (PGlite belongs to one process): skipped without DATABASE_URL.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { meterDecider, queuedRequests } from '../../deciders/meter.ts';
import { issueKey } from '../support/gateway.ts';
import { startGatewayCluster, type GatewayCluster } from '../support/gateway-cluster.ts';
import { until } from '../support/until.ts';

const databaseUrl = process.env.DATABASE_URL;
/** Long, so no hold or queue entry lapses on a loaded runner while the slow requests run. */
const ttlMs = 120_000;
/** Each slow request's one token takes this long at the engine: the window in which the queue fills. */
const slowMs = 10_000;

async function complete(url: string, key: string, body: Record<string, unknown>): Promise<{ status: number; code: string | undefined }> {
  const res = await fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` }, body: JSON.stringify(body) });
  const json = (await res.json()) as { error?: { code: string } };
  return { status: res.status, code: json.error?.code };
}

const it = suite<{ cluster: GatewayCluster }>('64 queued per key across two gateway processes');

if (!databaseUrl) {
  it('skipped: set DATABASE_URL to run the cross-process tests (two gateways need one PostgreSQL)', () => {});
} else {
  it.before(async (context) => {
    context.cluster = await startGatewayCluster(databaseUrl, { name: 'queue', gateways: 2, ttlMs });
  });

  it.after(async (context) => {
    await context.cluster?.stop();
  });

  it('16 slow requests running, 100 more split across both gateways: at most 64 wait, the rest 429 queue_full, every waiter completes', async (context) => {
    const [a, b] = context.cluster.gateways;
    const key = await issueKey(a.url, context.cluster.adminToken, { email: 'queue-bound@example.org' });
    for (const gw of [a, b]) assert.is((await complete(gw.url, key, { prompt: 'warm', max_tokens: 1, temperature: 0 })).status, 200);

    await context.cluster.chaos({ mode: 'delay', count: 16, delay_ms: slowMs });
    const slow = Array.from({ length: 16 }, (_, i) => complete((i % 2 === 0 ? a : b).url, key, { prompt: 'slow', max_tokens: 1, temperature: 0 }));
    await until('16 slow requests hold every active slot', async () => {
      const events = await context.cluster.meterEventsOf(key);
      return events.filter((e) => e.type === 'BudgetReserved').length === 18;
    });

    const queued = await Promise.all(Array.from({ length: 100 }, (_, i) => complete((i % 2 === 0 ? a : b).url, key, { prompt: 'q', max_tokens: 1, temperature: 0 })));
    const slowDone = await Promise.all(slow);
    for (const r of slowDone) assert.is(r.status, 200);

    const served = queued.filter((r) => r.status === 200);
    const refused = queued.filter((r) => r.status !== 200);
    for (const r of refused) assert.equal([r.status, r.code], [429, 'queue_full']);
    assert.ok(served.length <= 64, `${served.length} requests waited for a slot (bound 64 across both processes)`);
    assert.ok(refused.length >= 36, `${refused.length} refused queue_full`);

    // The meter agrees: at no point did more than 64 entries stand, and none is left.
    const events = await until('every waiter reserved and settled', async () => {
      const all = await context.cluster.meterEventsOf(key);
      return all.filter((e) => e.type === 'UsageSettled').length === 2 + 16 + served.length ? all : null;
    });
    let state = meterDecider.initialState();
    let peak = 0;
    for (const event of events) {
      state = meterDecider.evolve(state, event);
      if (event.type === 'RequestQueued') peak = Math.max(peak, queuedRequests(state, Date.parse(event.data.at)));
    }
    assert.ok(peak <= 64, `${peak} queue entries stood at once`);
    assert.is(Object.keys(state.queue).length, 0, 'every entry left with its reservation');
    const holders = new Set(events.flatMap((e) => (e.type === 'RequestQueued' ? [e.data.holder] : [])));
    assert.is(holders.size, 2, 'both gateways queued requests');
  });
}

it.run();
