/**
 * Harvest rules that cross processes, with real processes on one PostgreSQL: the monthly job quota
 * and the running-job cap hold across two gateways taking concurrent submits (they serialize on the
 * key's harvest stream); and jobs dispatched through the PostgreSQL transport to `svc worker`
 * processes survive the worker that holds one being killed: the other worker takes it over and goes
 * on from the first shard not recorded. Skipped without DATABASE_URL.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startHarvestStack, crash, type HarvestStack } from '../support/harvest-stack.ts';
import { postgresUnavailable } from '../support/postgres.ts';
import { issueKey, json } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { harvestEvents, harvestStream } from '../../events/harvest.ts';
import pg from 'pg';

const databaseUrl = process.env.DATABASE_URL;
const unavailable = await postgresUnavailable(databaseUrl);
const it = suite('harvests across processes on PostgreSQL');
let stack: HarvestStack;

if (!unavailable) {
  it.before(async () => {
    stack = await startHarvestStack({ name: 'harvest-procs', postgres: databaseUrl!, env: { SVC_HARVEST_LEASE_MS: '5000' } });
  });
  it.after(async () => {
    await stack?.stop();
  });

  /**
   * The harvest streams in append order, for a failed assertion to explain itself: each event's place,
   * transaction, type and metadata (command id, origin), and the quota events' data (job ids, month,
   * reasons); never a job's data (its prompts' hash, its key and user).
   */
  const harvestStreams = async (): Promise<string> => {
    const client = new pg.Client({ connectionString: stack.databaseUrl! });
    await client.connect();
    try {
      const { rows } = await client.query(
        `SELECT global_position::text AS pos, transaction_id::text AS tx, stream_id, stream_version, event_type,
                CASE WHEN stream_id LIKE 'harvest-quota-%' THEN data::text END AS data, metadata::text AS metadata
           FROM events WHERE stream_id LIKE 'harvest-%' ORDER BY global_position`,
      );
      return rows.map((r) => [r.pos, r.tx, r.stream_id, r.stream_version, r.event_type, r.data ?? '', r.metadata].join(' ')).join('\n');
    } finally {
      await client.end();
    }
  };

  const submit = (url: string, key: string, body: unknown) =>
    fetch(`${url}/v1/harvest`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });

  it('two gateways: the monthly quota and the running cap are held in total across concurrent submits', async () => {
    const a = await stack.serve();
    const b = await stack.serve();
    const gateways = [a.url, b.url];
    await stack.chaos({ mode: 'delay', count: 1_000_000, delay_ms: 300 });
    try {
      const slow = { model: 'ref-byte', prompts: Array.from({ length: 30 }, (_, i) => `p${i}`), shard_size: 1, batch_size: 1 };
      // Quota 3 over 8 concurrent submits, alternating gateways (the running cap, 3, is not what refuses: quota is checked first).
      const limited = await issueKey(a.url, stack.adminToken, { email: 'quota-procs@example.org', monthly_harvest_jobs: 3 });
      const quotaRun = await Promise.all(Array.from({ length: 8 }, (_, i) => submit(gateways[i % 2], limited, slow)));
      const quotaBodies = await Promise.all(quotaRun.map((r) => json(r)));
      const admitted = quotaRun.filter((r) => r.status === 202).length;
      if (admitted !== 3) assert.is(admitted, 3, `${JSON.stringify(quotaBodies.map((b) => b.error?.code ?? b.status))}\n${await harvestStreams()}`);
      assert.ok(quotaBodies.filter((b) => b.error).every((b) => b.error.code === 'harvest_quota_exceeded'));

      // No quota: the running cap (3) over 7 concurrent submits.
      const busy = await issueKey(a.url, stack.adminToken, { email: 'cap-procs@example.org' });
      const capRun = await Promise.all(Array.from({ length: 7 }, (_, i) => submit(gateways[i % 2], busy, slow)));
      const capBodies = await Promise.all(capRun.map((r) => json(r)));
      const running = capRun.filter((r) => r.status === 202).length;
      if (running !== 3) assert.is(running, 3, `${JSON.stringify(capBodies.map((b) => b.error?.code ?? b.status))}\n${await harvestStreams()}`);
      assert.ok(capBodies.filter((b) => b.error).every((b) => b.error.code === 'harvest_concurrency_exceeded'));

      // Cancelled through either gateway, the slots free up for the next submit.
      for (const [i, body] of [...quotaBodies, ...capBodies].filter((b) => b.id).entries()) {
        const key = quotaBodies.includes(body) ? limited : busy;
        const res = await fetch(`${gateways[i % 2]}/v1/harvest/${body.id}`, { method: 'DELETE', headers: { authorization: `Bearer ${key}` } });
        assert.is(res.status, 200);
      }
      assert.is((await submit(b.url, busy, { model: 'ref-byte', prompts: ['after'] })).status, 202);
      assert.is((await submit(b.url, limited, { model: 'ref-byte', prompts: ['after'] })).status, 429, 'cancelled jobs still count against the month');
    } finally {
      await stack.chaos({ mode: 'none' });
      for (const g of [a, b]) await crash(g.child);
    }
  });

  it('svc worker processes: a job survives the worker holding it being killed, every shard recorded once', async () => {
    const gateway = await stack.serve({}, ['--no-workers']);
    const workers = [await stack.worker(), await stack.worker()];
    const key = await issueKey(gateway.url, stack.adminToken, { email: 'workers@example.org' });
    await stack.chaos({ mode: 'delay', count: 1_000_000, delay_ms: 250 });
    const prompts = Array.from({ length: 8 }, (_, i) => `worker prompt ${i}`);
    const res = await submit(gateway.url, key, { model: 'ref-byte', prompts, shard_size: 1, batch_size: 1 });
    assert.is(res.status, 202);
    const id = (await json(res)).id as string;
    const headers = { authorization: `Bearer ${key}` };
    await until('two shards written', async () => (await json(await fetch(`${gateway.url}/v1/harvest/${id}?wait=5`, { headers }))).progress.shards_done >= 2);
    const store = await stack.openStore();
    const events = async () => (await store.readStream(harvestStream(id))).events.map((e) => harvestEvents.parse(e));
    const claim = (await events()).filter((e) => e.type === 'HarvestClaimed').map((e) => e.data as { worker_id: string; claim_id: string })[0];
    const holder = workers.find((w) => claim.worker_id.startsWith(`worker-${w.pid}-`));
    assert.ok(holder, `the claim names a worker process: ${claim.worker_id}`);
    await crash(holder!);
    await stack.chaos({ mode: 'none' });
    const done = await until(
      'the other worker to finish the job',
      async () => {
        const job = await json(await fetch(`${gateway.url}/v1/harvest/${id}?wait=5`, { headers }));
        return job.status === 'running' || job.status === 'pending' ? null : job;
      },
      60_000,
    );
    assert.is(done.status, 'succeeded', JSON.stringify(done.error));
    const all = await events();
    assert.equal(
      all.filter((e) => e.type === 'HarvestShardWritten').map((e) => (e.data as { shard: number }).shard),
      [0, 1, 2, 3, 4, 5, 6, 7],
    );
    const claims = all.filter((e) => e.type === 'HarvestClaimed').map((e) => e.data as { worker_id: string });
    assert.is(claims.length, 2);
    const survivor = workers.find((w) => w !== holder)!;
    assert.ok(claims[1].worker_id.startsWith(`worker-${survivor.pid}-`), 'the surviving worker took it over');
    // The shard downloads are served by the gateway from the shared harvest directory.
    const shard = await fetch(`${gateway.url}${done.result.shards[7].url}`, { headers });
    assert.is(shard.status, 200);
    assert.is(Number(shard.headers.get('content-length')), done.result.shards[7].bytes);
    await shard.arrayBuffer();
  });
} else {
  it.skip(`gateways and workers on one PostgreSQL: ${unavailable}`, () => {});
}

it.run();
