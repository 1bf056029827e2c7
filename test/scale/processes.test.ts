/**
 * Scaling out with real processes on one PostgreSQL: three `svc serve` gateways and two `svc worker`
 * processes (harvest jobs on the PostgreSQL transport) in front of one reference engine. One process
 * holds every projection's and workflow's lease (the lease table and `svc projections status` say
 * which); when it is SIGKILLed another takes them over within about 1⅓ leases and the tables go on
 * (a key issued after the kill is in api_keys, a completion's usage in key_usage); a key's budget,
 * rate and active limits hold in total across the three gateways; a harvest whose worker is killed is
 * finished once by the other. Skipped without DATABASE_URL.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { startHarvestStack, crash, type HarvestStack } from '../support/harvest-stack.ts';
import { postgresUnavailable } from '../support/postgres.ts';
import { json } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { assertRollingMinuteLimit } from '../support/rate-window.ts';
import { sqlLeases, type LeaseRow } from '../../src/processors/index.ts';
import type { EventStore } from '../../src/store/index.ts';
import { meterEvents, meterStream, utcDay, type MeterEvent } from '../../events/meter.ts';
import { meterDecider } from '../../deciders/meter.ts';
import { harvestEvents, harvestStream } from '../../events/harvest.ts';
import { backendEvents, backendStream } from '../../events/backend.ts';
import { projections } from '../../projections/index.ts';
import { breakerHalfOpenWorkflow, workflows } from '../../workflows/index.ts';

const databaseUrl = process.env.DATABASE_URL;
const unavailable = await postgresUnavailable(databaseUrl);
const it = suite('gateways and workers on one PostgreSQL: one process per projection and workflow');

const leaseMs = 3000;
const limits = { rate_limit_per_minute: 30, max_inflight_per_key: 4 };
const projectionNames = projections.map((p) => p.name).sort();
// The gateway's workflows: those of workflows/index.ts and the timers its services bring (no spend cap here: no spend watcher).
const timerNames = [breakerHalfOpenWorkflow.name, 'hold-reaper', 'harvest-resumer', 'harvest-age-out', 'harvest-orphans', 'harvest-retention'];
const workflowNames = [...workflows.map((w) => w.name), ...timerNames].map((name) => `workflow:${name}`).sort();
const leaseNames = [...projectionNames, ...workflowNames].sort();
const svc = fileURLToPath(new URL('../../bin/svc.js', import.meta.url));

let stack: HarvestStack;
let store: EventStore;
const gateways: { child: ChildProcess; url: string }[] = [];
const workers: ChildProcess[] = [];

const pidOf = (holder: string | null) => Number(holder?.split(':').at(-2));
const heldLeases = async (): Promise<LeaseRow[]> => (await sqlLeases(store).list(store)).filter((l) => l.held && leaseNames.includes(l.name));
/**
 * Once every lease is held: the pid holding all the projections' (one runner claims them together)
 * and the one holding all the workflows' (the workflow processor's, in the same process or another).
 */
async function holders(): Promise<{ projections: number; workflows: number } | null> {
  const held = await heldLeases();
  if (held.length !== leaseNames.length) return null;
  const pids = (names: string[]) => new Set(held.filter((l) => names.includes(l.name)).map((l) => pidOf(l.holder)));
  const [p, w] = [pids(projectionNames), pids(workflowNames)];
  return p.size === 1 && w.size === 1 ? { projections: [...p][0], workflows: [...w][0] } : null;
}

const admin = (url: string, path: string, body?: unknown) =>
  fetch(`${url}${path}`, { method: body ? 'POST' : 'GET', headers: { authorization: `Bearer ${stack.adminToken}`, 'content-type': 'application/json' }, body: body ? JSON.stringify(body) : undefined });
async function issue(url: string, body: Record<string, unknown>): Promise<{ key: string; key_id: string; prefix: string }> {
  const res = await admin(url, '/admin/keys', body);
  assert.is(res.status, 201);
  return json(res);
}
const complete = (url: string, key: string, body: Record<string, unknown>) =>
  fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` }, body: JSON.stringify(body) });
const meterOf = async (prefix: string): Promise<MeterEvent[]> => (await store.readStream(meterStream(prefix, utcDay(new Date())))).events.map((e) => meterEvents.parse(e));
const tokensOf = (e: MeterEvent) => (e.data as { input_tokens: number }).input_tokens + (e.data as { output_tokens: number }).output_tokens;
async function enginePeak(): Promise<number> {
  const text = await (await fetch(`${stack.engineUrl}/metrics`)).text();
  return Number(text.match(/^svc_engine_requests_running_peak\{[^}]*\} (\d+)/m)?.[1] ?? NaN);
}

if (!unavailable) {
  it.before(async () => {
    stack = await startHarvestStack({
      name: 'scale',
      postgres: databaseUrl!,
      env: { SVC_PROCESSOR_LEASE_MS: String(leaseMs), SVC_HARVEST_LEASE_MS: '2000', SVC_BREAKER_FAILURE_THRESHOLD: '3', SVC_BREAKER_COOLDOWN_MS: '2000' },
      model: (model) => ({ ...model, capabilities: { ...model.capabilities, ...limits } }),
    });
    // The first alone (it runs the migrations); it takes every lease.
    gateways.push(await stack.serve({}, ['--no-workers']));
    // The others one at a time too: four processes starting at once beside a full suite's other files once ran out of the 90 s a start is given.
    for (let i = 0; i < 2; i++) gateways.push(await stack.serve({}, ['--no-workers']));
    for (let i = 0; i < 2; i++) workers.push(await stack.worker());
    store = await stack.openStore();
  });
  it.after(async () => {
    await stack?.stop();
  });

  it('one process holds every projection lease (and one every workflow lease), as the lease table and svc projections status show', async () => {
    const held = await until('one process holding the projections, one the workflows', holders, 20_000, 50);
    const pids = [...gateways.map((g) => g.child.pid), ...workers.map((w) => w.pid)];
    assert.ok(pids.includes(held.projections) && pids.includes(held.workflows), JSON.stringify(held));
    console.log(`  projections held by ${held.projections === gateways[0].child.pid ? 'the first gateway' : `pid ${held.projections}`}, workflows by ${held.workflows === held.projections ? 'the same process' : `pid ${held.workflows}`}`);
    const cli = spawn(process.execPath, [svc, 'projections', 'status', '--json'], { env: { ...process.env, DATABASE_URL: stack.databaseUrl! }, stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    cli.stdout!.on('data', (chunk) => (out += chunk));
    const code = await new Promise((resolve) => cli.once('exit', resolve));
    assert.is(code, 0);
    const rows = JSON.parse(out) as { name: string; holder: string | null; lease_held: boolean }[];
    assert.equal(rows.map((r) => r.name).sort(), leaseNames);
    assert.ok(rows.every((r) => r.lease_held && pidOf(r.holder) === (projectionNames.includes(r.name) ? held.projections : held.workflows)), out);
  });

  it("a key's monthly budget holds in total across three gateways: concurrent completions through all three settle at most the budget", async () => {
    const budget = 300;
    const { key, prefix } = await issue(gateways[0].url, { email: 'scale-budget@example.org', monthly_token_budget: budget });
    // One request through each first, so that every gateway holds a lease on the key's slots when the burst starts.
    let served = 0;
    for (const gw of gateways) {
      const res = await complete(gw.url, key, { prompt: 'abc', max_tokens: 20, temperature: 0 });
      assert.is(res.status, 200);
      served += (await json(res)).usage.total_tokens;
    }
    await stack.chaos({ mode: 'delay', count: 1000, delay_ms: 20 });
    const responses = await Promise.all(
      Array.from({ length: 24 }, async (_, i) => {
        const res = await complete(gateways[i % 3].url, key, { prompt: 'abc', max_tokens: 20, temperature: 0 });
        const body = await json(res);
        return { status: res.status, code: body.error?.code as string | undefined, tokens: body.usage?.total_tokens as number | undefined };
      }),
    );
    await stack.chaos({ mode: 'none' });
    for (const r of responses.filter((r) => r.status !== 200)) assert.ok(['budget_exceeded', 'queue_full'].includes(r.code!), `unexpected ${r.status} ${r.code}`);
    assert.ok(responses.some((r) => r.code === 'budget_exceeded'), 'the budget ran out');
    served += responses.reduce((n, r) => n + (r.tokens ?? 0), 0);
    assert.ok(served <= budget, `clients were served ${served} tokens of ${budget}`);
    const events = await until('every hold settled', async () => {
      const meter = await meterOf(prefix);
      const reserved = meter.filter((e) => e.type === 'BudgetReserved').length;
      return reserved > 0 && meter.filter((e) => e.type === 'UsageSettled').length === reserved ? meter : null;
    });
    const settled = events.filter((e) => e.type === 'UsageSettled').reduce((n, e) => n + tokensOf(e), 0);
    assert.ok(settled <= budget, `settled ${settled} tokens of a ${budget}-token budget`);
  });

  it('the rate and active limits hold in total across three gateways', async () => {
    const { key, prefix } = await issue(gateways[1].url, { email: 'scale-limits@example.org' });
    await stack.chaos({ mode: 'delay', count: 1000, delay_ms: 150 });
    const started = Date.now();
    const responses = await Promise.all(
      Array.from({ length: 45 }, async (_, i) => {
        const res = await complete(gateways[i % 3].url, key, { prompt: 'r', max_tokens: 1, temperature: 0 });
        return { status: res.status, code: (await json(res)).error?.code as string | undefined };
      }),
    );
    await stack.chaos({ mode: 'none' });
    for (const r of responses.filter((r) => r.status !== 200)) assert.is(r.code, 'rate_limited', `unexpected ${r.status} ${r.code}`);
    const refused = responses.filter((r) => r.status === 429).length;
    const events = await until('every refusal recorded', async () => {
      const meter = await meterOf(prefix);
      return meter.filter((e) => e.type === 'RequestRejected').length === refused ? meter : null;
    });
    assertRollingMinuteLimit(events, limits.rate_limit_per_minute);
    if (Date.now() - started < 60_000) assert.is(responses.filter((r) => r.status === 200).length, limits.rate_limit_per_minute);
    // The meter's own record, across the three processes: never more holds at once than the limit.
    let state = meterDecider.initialState();
    let most = 0;
    for (const event of events) {
      state = meterDecider.evolve(state, event);
      most = Math.max(most, state.holds.size);
    }
    const peak = await enginePeak();
    const { cancelled } = await json(await fetch(`${stack.engineUrl}/_chaos/running`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ count: 0 }) }));
    console.log(`  active: at most ${most} holds at once on the meter, ${peak} generations at once at the engine (${cancelled} cancelled there)`);
    assert.ok(most <= limits.max_inflight_per_key, `${most} holds at once on the meter`);
    // A call sent in a slot lease before its reservation was durable, whose decision another process's append then superseded, runs at the engine until its cancellation arrives.
    assert.ok(peak <= limits.max_inflight_per_key + cancelled, `${peak} generations ran at once at the engine, ${cancelled} cancelled there`);
    assert.ok(most > 1, 'requests overlapped');
  });

  it("one breaker for three gateways: opened by one gateway's failures, refused by all, and one half-open probe among concurrent requests through all three", async () => {
    const { key } = await issue(gateways[2].url, { email: 'scale-breaker@example.org' });
    const probesBefore = (await store.readStream(backendStream('ref-byte'))).events.map((e) => backendEvents.parse(e)).filter((e) => e.type === 'ProbeStarted').length;
    await stack.chaos({ mode: 'error500', count: 1_000 });
    try {
      for (let i = 0; i < 3; i++) assert.is((await complete(gateways[0].url, key, { prompt: 'x', max_tokens: 1 })).status, 502);
      // The other two learn it from the log: refused without contacting the engine.
      for (const gw of gateways) {
        await until(`${gw.url} to refuse with circuit_open`, async () => {
          const res = await complete(gw.url, key, { prompt: 'x', max_tokens: 1 });
          return res.status === 503 && (await json(res)).error.code === 'circuit_open';
        }, 10_000, 50);
      }
      // The engine recovers (slowly, so the probe is still under way when the others ask); the cooldown ends.
      await stack.chaos({ mode: 'delay', count: 1_000, delay_ms: 800 });
      await new Promise((r) => setTimeout(r, 2_300));
      const results = await Promise.all(Array.from({ length: 6 }, (_, i) => complete(gateways[i % 3].url, key, { prompt: 'x', max_tokens: 1 }).then(async (r) => ({ status: r.status, code: (await json(r)).error?.code }))));
      assert.is(results.filter((r) => r.status === 200).length, 1, JSON.stringify(results));
      assert.ok(results.filter((r) => r.status !== 200).every((r) => r.status === 503 && r.code === 'circuit_open'), JSON.stringify(results));
      // The probe's success closes the breaker just after its answer went out.
      const events = await until('the breaker closed by the probe', async () => {
        const read = (await store.readStream(backendStream('ref-byte'))).events.map((e) => backendEvents.parse(e));
        return read.at(-1)!.type === 'BreakerClosed' ? read : null;
      }, 10_000, 50);
      assert.is(events.filter((e) => e.type === 'ProbeStarted').length, probesBefore + 1, 'one probe across the three gateways');
    } finally {
      await stack.chaos({ mode: 'none' });
    }
    // Closed everywhere again.
    for (const gw of gateways) await until(`${gw.url} to serve again`, async () => (await complete(gw.url, key, { prompt: 'x', max_tokens: 1 })).status === 200, 10_000, 50);
  });

  it('the process holding the projections SIGKILLed: another takes them over within about 1⅓ leases, and the tables go on (api_keys, key_usage)', async () => {
    const holderPid = (await until('one process holding the projections', holders, 20_000, 50)).projections;
    const victim = [...gateways.map((g) => g.child), ...workers].find((c) => c.pid === holderPid)!;
    assert.ok(victim, `the holder ${holderPid} is one of the processes`);
    const killedAt = performance.now();
    await crash(victim);
    const successor = await until('every lease held by a live process', async () => {
      const held = await heldLeases();
      return held.length === leaseNames.length && held.every((l) => pidOf(l.holder) !== holderPid) ? held : null;
    }, 30_000, 25);
    const takeoverMs = performance.now() - killedAt;
    const successors = new Set(successor.map((l) => pidOf(l.holder)));
    console.log(`  takeover after SIGKILL: ${Math.round(takeoverMs)} ms (SVC_PROCESSOR_LEASE_MS=${leaseMs}); ${successors.size} process(es) took the ${leaseNames.length} leases`);
    assert.ok(takeoverMs < (leaseMs * 4) / 3 + 2000, `taken over after ${Math.round(takeoverMs)} ms`);

    const alive = gateways.filter((g) => g.child !== victim);
    const { key, key_id: keyId, prefix } = await issue(alive[0].url, { email: 'after-the-kill@example.org' });
    // The admin list waits for the projections to catch up (whoever applies them), then reads api_keys.
    const list = await json(await admin(alive[alive.length - 1].url, '/admin/keys'));
    assert.ok(list.data.some((k: { prefix: string }) => k.prefix === prefix), 'the key issued after the kill is listed');
    const { rows: issued } = await store.query('SELECT prefix FROM api_keys WHERE key_id = $1', [keyId]);
    assert.equal(issued, [{ prefix }]);
    const res = await complete(alive[0].url, key, { prompt: 'after', max_tokens: 5, temperature: 0 });
    assert.is(res.status, 200);
    const tokens = (await json(res)).usage.total_tokens as number;
    const usage = await until('the completion in key_usage', async () => {
      const { rows } = await store.query<{ input_tokens: string; output_tokens: string; requests: string }>(
        `SELECT input_tokens, output_tokens, requests FROM key_usage WHERE key_id = $1 AND period_kind = 'month'`,
        [keyId],
      );
      return rows[0] && Number(rows[0].requests) === 1 ? rows[0] : null;
    }, 20_000);
    assert.is(Number(usage.input_tokens) + Number(usage.output_tokens), tokens);
    gateways.splice(gateways.findIndex((g) => g.child === victim), 1);
    const w = workers.indexOf(victim);
    if (w >= 0) workers.splice(w, 1);
  });

  it('a harvest whose worker is killed is finished by the other, every shard recorded once', async () => {
    if (workers.length < 2) workers.push(await stack.worker()); // the lease holder killed above was a worker
    const gateway = gateways[0];
    const { key } = await issue(gateway.url, { email: 'scale-harvest@example.org' });
    await stack.chaos({ mode: 'delay', count: 1_000_000, delay_ms: 250 });
    const headers = { authorization: `Bearer ${key}`, 'content-type': 'application/json' };
    const prompts = Array.from({ length: 8 }, (_, i) => `scale prompt ${i}`);
    const res = await fetch(`${gateway.url}/v1/harvest`, { method: 'POST', headers, body: JSON.stringify({ model: 'ref-byte', prompts, shard_size: 1, batch_size: 1 }) });
    assert.is(res.status, 202);
    const id = (await json(res)).id as string;
    await until('two shards written', async () => (await json(await fetch(`${gateway.url}/v1/harvest/${id}?wait=5`, { headers }))).progress.shards_done >= 2);
    const events = async () => (await store.readStream(harvestStream(id))).events.map((e) => harvestEvents.parse(e));
    const claim = (await events()).filter((e) => e.type === 'HarvestClaimed').map((e) => e.data as { worker_id: string })[0];
    const holder = workers.find((w) => claim.worker_id.startsWith(`worker-${w.pid}-`));
    assert.ok(holder, `the claim names a worker process: ${claim.worker_id}`);
    await crash(holder!);
    await stack.chaos({ mode: 'none' });
    const done = await until('the other worker finishing the job', async () => {
      const job = await json(await fetch(`${gateway.url}/v1/harvest/${id}?wait=5`, { headers }));
      return job.status === 'running' || job.status === 'pending' ? null : job;
    }, 90_000);
    assert.is(done.status, 'succeeded', JSON.stringify(done.error));
    const all = await events();
    assert.equal(all.filter((e) => e.type === 'HarvestShardWritten').map((e) => (e.data as { shard: number }).shard), [0, 1, 2, 3, 4, 5, 6, 7]);
    assert.is(all.filter((e) => e.type === 'HarvestSucceeded').length, 1, 'finished once');
    // harvest_jobs, kept by whichever process holds its lease now, says so too.
    await until('harvest_jobs showing the job succeeded', async () => {
      const { rows } = await store.query<{ status: string }>('SELECT status FROM harvest_jobs WHERE job_id = $1', [id]);
      return rows[0]?.status === 'succeeded';
    }, 20_000);
  });
} else {
  it.skip(`gateways and workers on one PostgreSQL: ${unavailable}`, () => {});
}

it.run();
