/**
 * Rules that cross processes, proven with real processes: two `svc serve` gateways on one PostgreSQL
 * database and one shared reference engine (so concurrency is counted at the engine). Budgets, the
 * active cap and the request rate hold across both; a gateway killed with SIGKILL leaks no hold.
 * PostgreSQL only (PGlite belongs to one process): skipped without DATABASE_URL.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { meterDecider, type MeterState } from '../../deciders/meter.ts';
import { foldEvents } from '../../src/event-sourcing/index.ts';
import { meterEvents, type MeterEvent } from '../../events/meter.ts';
import { issueKey } from '../support/gateway.ts';
import { startGatewayCluster, type GatewayCluster } from '../support/gateway-cluster.ts';
import { assertRollingMinuteLimit } from '../support/rate-window.ts';
import { until } from '../support/until.ts';
import { writeFileSync } from 'node:fs';
import { meterStream, utcDay } from '../../events/meter.ts';

/**
 * Diagnostics for the two-gateway budget race: on a hold left open, prints the held request ids, every
 * stored event of those requests (type, version, data, metadata, writer) and the HTTP responses they got;
 * the whole stream goes to a file beside it.
 */
async function dumpHolds(cluster: GatewayCluster, key: string, origins: Map<string, string>, responses: Map<string, unknown>): Promise<void> {
  const keyId = key.split('_')[1];
  const days = [...new Set([utcDay(new Date(Date.now() - 120_000)), utcDay(new Date())])];
  const out: string[] = [];
  const all: unknown[] = [];
  for (const day of days) {
    const read = await cluster.store.readStream(meterStream(keyId, day));
    const events = read.events;
    all.push(...events.map((e) => ({ stream: e.streamId, v: e.streamVersion, pos: e.globalPosition, at: e.recordedAt, type: e.type, data: e.data, metadata: e.metadata, writer: origins.get(String(e.metadata?.origin)) ?? String(e.metadata?.origin) })));
    const state = foldEvents(meterDecider, meterDecider.initialState(), events.map((e) => meterEvents.parse(e)));
    out.push(`[diag] stream ${meterStream(keyId, day)} version ${read.version}: ${state.holds.size} holds open: ${[...state.holds.keys()].join(', ')}`);
    out.push(`[diag] leases ${JSON.stringify(state.leases)} queue ${JSON.stringify(state.queue)}`);
    for (const [id, hold] of state.holds) {
      out.push(`[diag] held ${id}: ${JSON.stringify(hold)}; response ${JSON.stringify(responses.get(id) ?? 'none recorded')}`);
      for (const e of events) {
        const d = e.data as { request_id?: string };
        const cmd = String(e.metadata?.command_id ?? '');
        if (d.request_id === id || cmd.endsWith(id) || e.metadata?.request_id === id) {
          out.push(`[diag]   v${e.streamVersion} pos ${e.globalPosition.transactionId}/${e.globalPosition.position} ${e.recordedAt.toISOString()} ${e.type} by ${origins.get(String(e.metadata?.origin)) ?? e.metadata?.origin} data ${JSON.stringify(e.data)} metadata ${JSON.stringify(e.metadata)}`);
        }
      }
    }
  }
  const file = `/tmp/race-stream-${Date.now()}.json`;
  writeFileSync(file, JSON.stringify({ origins: Object.fromEntries(origins), responses: Object.fromEntries(responses), events: all }, null, 1));
  out.push(`[diag] whole stream and responses in ${file}`);
  console.error(out.join('\n'));
}

const databaseUrl = process.env.DATABASE_URL;
/**
 * The reservation TTL of the gateways that are killed and restarted, short so the test sees holds
 * expire. The two long-lived gateways keep the default-like TTL: on a loaded runner a renewal can come
 * late, and a 4 s TTL would then expire holds of requests still running (charged whole, correctly,
 * but not what the budget test counts).
 */
const shortTtlMs = 4000;
const longTtlMs = 120_000;

async function engineGauge(cluster: GatewayCluster, name: string): Promise<number> {
  const text = await (await fetch(`${cluster.engineUrl}/metrics`)).text();
  return Number(text.match(new RegExp(`^${name}\\{[^}]*\\} (\\d+)`, 'm'))?.[1] ?? NaN);
}

async function meterOf(cluster: GatewayCluster, key: string): Promise<{ events: MeterEvent[]; state: MeterState }> {
  const events = await cluster.meterEventsOf(key);
  return { events, state: foldEvents(meterDecider, meterDecider.initialState(), events) };
}

function complete(url: string, key: string, body: Record<string, unknown>): Promise<Response> {
  return fetch(`${url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` }, body: JSON.stringify(body) });
}

const tokensOf = (e: MeterEvent) => (e.data as { input_tokens: number }).input_tokens + (e.data as { output_tokens: number }).output_tokens;

const it = suite<{ cluster: GatewayCluster }>('two gateway processes on one PostgreSQL');

if (!databaseUrl) {
  it('skipped: set DATABASE_URL to run the cross-process tests', () => {});
} else {
  it.before(async (context) => {
    context.cluster = await startGatewayCluster(databaseUrl, { name: 'two', gateways: 2, ttlMs: longTtlMs });
  });

  it.after(async (context) => {
    await context.cluster?.stop();
  });

  it('200 concurrent requests through both: at most B tokens settled, no hold left open, at most 16 running at the engine', async (context) => {
    const [a, b] = context.cluster.gateways;
    const budget = 2000;
    const key = await issueKey(a.url, context.cluster.adminToken, { email: 'two@example.org', monthly_token_budget: budget });
    // One request through each first, so that both processes hold a lease on the key when the burst
    // starts. Without it, one process can lease all 16 slots before the other's first reservation and
    // keep them while it has requests waiting, and the budget may run out before the other gets one.
    const warmUp = [];
    const warmUpIds: string[] = [];
    for (const gw of [a, b]) {
      const res = await complete(gw.url, key, { prompt: 'abc', max_tokens: 20, temperature: 0 });
      assert.is(res.status, 200);
      warmUpIds.push(res.headers.get('x-request-id') ?? '?');
      warmUp.push(((await res.json()) as any).usage.total_tokens as number);
    }
    const answered = new Map<string, unknown>();
    await context.cluster.chaos({ mode: 'delay', count: 1000, delay_ms: 4 });
    const responses = await Promise.all(
      Array.from({ length: 200 }, async (_, i) => {
        const sent = Date.now();
        const res = await complete((i % 2 === 0 ? a : b).url, key, { prompt: 'abc', max_tokens: 20, temperature: 0 });
        const body = (await res.json()) as any;
        answered.set(res.headers.get('x-request-id') ?? `?${i}`, { gateway: i % 2 === 0 ? 'A' : 'B', i, status: res.status, ms: Date.now() - sent, clamped: res.headers.get('x-svc-max-tokens-clamped'), body });
        return { status: res.status, code: body.error?.code as string | undefined, tokens: body.usage?.total_tokens as number | undefined };
      }),
    );
    await context.cluster.chaos({ mode: 'none' });
    const served = responses.filter((r) => r.status === 200);
    const codes = new Set(responses.filter((r) => r.status !== 200).map((r) => `${r.status} ${r.code}`));
    for (const code of codes) assert.ok(['429 budget_exceeded', '429 queue_full'].includes(code), `unexpected ${code}`);
    assert.ok(served.length > 16, `${served.length} served`);
    const clientTotal = served.reduce((n, r) => n + r.tokens!, warmUp[0] + warmUp[1]);
    assert.ok(clientTotal <= budget, `clients were served ${clientTotal} tokens of a ${budget}-token budget`);
    const { events, state } = await until('every hold released', async () => {
      const meter = await meterOf(context.cluster, key);
      return meter.state.holds.size === 0 && meter.events.filter((e) => e.type === 'UsageSettled').length === served.length + warmUp.length ? meter : null;
    }).catch(async (error) => {
      const keyId = key.split('_')[1];
      const raw = (await context.cluster.store.readStream(meterStream(keyId, utcDay(new Date())))).events;
      const origins = new Map<string, string>();
      for (const [id, name] of [[warmUpIds[0], 'A'], [warmUpIds[1], 'B']]) {
        const origin = raw.find((e) => e.metadata?.request_id === id)?.metadata?.origin;
        if (origin) origins.set(String(origin), name);
      }
      console.error(`[diag] ${served.length} served + ${warmUp.length} warm-ups; settled ${raw.filter((e) => e.type === 'UsageSettled').length}; gateway pids A ${a.child.pid} B ${b.child.pid}`);
      await dumpHolds(context.cluster, key, origins, answered);
      throw error;
    });
    const settled = events.filter((e) => e.type === 'UsageSettled' || e.type === 'ReservationExpired').reduce((n, e) => n + tokensOf(e), 0);
    assert.ok(settled <= budget, `settled ${settled} tokens of a ${budget}-token budget`);
    assert.is(settled, state.monthInput + state.monthOutput);
    const peak = await engineGauge(context.cluster, 'svc_engine_requests_running_peak');
    assert.ok(peak <= 16, `${peak} generations ran at once at the engine`);
    assert.ok(peak > 1, 'requests overlapped');
    // With slot leases in play: both processes held one, and reservations made in a standing lease (not
    // taking or growing it in the same append) started their engine call before their append was durable.
    const holders = new Set(events.flatMap((e) => (e.type === 'SlotsLeased' ? [e.data.holder] : [])));
    assert.is(holders.size, 2, 'each gateway leased slots');
    const inLease = events.filter((e, i) => e.type === 'BudgetReserved' && e.data.lease_holder !== null && events[i - 1]?.type !== 'SlotsLeased');
    assert.ok(inLease.length > 0, 'some engine calls started alongside their append');
  });

  it('at most 600 request starts per rolling minute across both gateways', async (context) => {
    const [a, b] = context.cluster.gateways;
    const key = await issueKey(b.url, context.cluster.adminToken, { email: 'rate2@example.org' });
    const statuses: number[] = [];
    const started = Date.now();
    for (let wave = 0; wave < 14; wave++) {
      const responses = await Promise.all(Array.from({ length: 50 }, (_, i) => complete((i % 2 === 0 ? a : b).url, key, { prompt: 'r', max_tokens: 1, temperature: 0 })));
      for (const r of responses) {
        statuses.push(r.status);
        const body = (await r.json()) as any;
        if (r.status !== 200) assert.is(body.error.code, 'rate_limited', body.error.message);
      }
    }
    const refused = statuses.filter((s) => s === 429).length;
    assert.ok(refused > 0, 'some requests were refused');
    const { events } = await until('every refusal recorded', async () => {
      const meter = await meterOf(context.cluster, key);
      return meter.events.filter((e) => e.type === 'RequestRejected').length === refused ? meter : null;
    });
    assertRollingMinuteLimit(events, 600);
    // Inside one minute the counts are exact (a slower machine lets the first starts leave the window).
    if (Date.now() - started < 60_000) {
      assert.is(statuses.filter((s) => s === 200).length, 600);
      assert.is(refused, 100);
    }
  });

  it('a gateway killed with SIGKILL mid-request: after a restart and the TTL every hold is released, every acknowledged settlement is kept', async (context) => {
    const victim = await context.cluster.startGateway(shortTtlMs);
    const key = await issueKey(victim.url, context.cluster.adminToken, { email: 'killed@example.org' });
    for (let i = 0; i < 3; i++) assert.is((await complete(victim.url, key, { prompt: 'done', max_tokens: 3, temperature: 0 })).status, 200);
    await until('three settlements stored', async () => (await meterOf(context.cluster, key)).events.filter((e) => e.type === 'UsageSettled').length === 3);
    await context.cluster.chaos({ mode: 'delay', count: 4, delay_ms: 500 });
    const running = Array.from({ length: 4 }, () => complete(victim.url, key, { prompt: 'slow', max_tokens: 100, temperature: 0 }).catch(() => null));
    await until('four holds stored', async () => (await meterOf(context.cluster, key)).state.holds.size === 4);
    victim.child.kill('SIGKILL');
    await Promise.all(running);
    await context.cluster.chaos({ mode: 'none' });
    const restarted = await context.cluster.startGateway(shortTtlMs);
    const { events } = await until('every hold expired', async () => {
      const meter = await meterOf(context.cluster, key);
      return meter.state.holds.size === 0 ? meter : null;
    }, 60_000);
    assert.is(events.filter((e) => e.type === 'UsageSettled').length, 3, 'acknowledged settlements are all there');
    const expired = events.filter((e) => e.type === 'ReservationExpired');
    assert.is(expired.length, 4);
    const reservations = new Map(events.filter((e) => e.type === 'BudgetReserved').map((e) => [(e.data as { request_id: string }).request_id, tokensOf(e)]));
    for (const e of expired) assert.is(tokensOf(e), reservations.get((e.data as { request_id: string }).request_id), 'an expired hold charges the whole reservation');
    restarted.child.kill('SIGTERM');
  });
}

it.run();
