/**
 * backend_health's last_completion_at, from the settlements on the meter streams: the latest served
 * completion per model (a settlement answered 200, or a stream its client left, that ran), never a
 * request refused before the engine or one that failed; the same rows applied twice and however the
 * log is cut into batches; the breaker columns untouched by it.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import type { EventStore } from '../../src/store/index.ts';
import { backendHealthProjection, lastCompletions } from '../../projections/backend-health.ts';
import { BackendFailed, backendStream } from '../../events/backend.ts';
import { LateUsageRecorded, meterStream, UsageSettled, type RequestFactsData } from '../../events/meter.ts';
import { schemaVersionKey } from '../../src/event-sourcing/index.ts';
import { adaptersUnderTest } from '../store/adapters.ts';
import { applyTwice, recorded } from '../support/projection-specification.ts';

const t = (s: number) => new Date(Date.parse('2026-11-26T12:00:00.000Z') + s * 1000).toISOString();
const facts = (requestId: string, model: string | null, endpoint = '/v1/completions'): RequestFactsData => ({
  request_id: requestId,
  key_prefix: 'kp',
  email: 'ada@example.com',
  client_ip: null,
  endpoint,
  model,
  user: null,
  workload: null,
});
const settlement = (requestId: string, model: string | null, s: number, over: Partial<ReturnType<typeof UsageSettled>['data']> = {}) =>
  UsageSettled({
    ...facts(requestId, model),
    input_tokens: 3,
    output_tokens: 2,
    status: 200,
    latency_ms: 10,
    gpu_seconds: 0.01,
    disconnected: false,
    at: t(s),
    cost_micros: 0,
    price_per_gpu_second_micros: 0,
    basis: 'engine_usage',
    generated_output_tokens: null,
    relayed_output_tokens: null,
    ...over,
  });
const late = (requestId: string, model: string, s: number) => {
  const { generated_output_tokens: _g, relayed_output_tokens: _r, ...data } = settlement(requestId, model, s).data;
  return LateUsageRecorded(data);
};
const meter = meterStream('k1', '2026-11-26');
let version = 0;
// Written at the catalogue's current version (recorded() says version 1 unless told).
const onMeter = (event: ReturnType<typeof UsageSettled> | ReturnType<typeof LateUsageRecorded>) =>
  recorded(event, { streamId: meter, streamVersion: ++version, metadata: { [schemaVersionKey]: event.type === 'UsageSettled' ? 3 : 1 } });
const query = (models: string[]) =>
  `SELECT model_id, backend, breaker_state, consecutive_failures, last_completion_at, updated_at FROM backend_health WHERE model_id IN (${models.map((m) => `'${m}'`).join(', ')}) ORDER BY model_id, backend`;
const iso = (v: unknown) => (v === null ? null : new Date(v as string).toISOString());
const norm = (rows: Record<string, unknown>[]) => rows.map((r) => ({ ...r, last_completion_at: iso(r.last_completion_at), updated_at: iso(r.updated_at) }));

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore }>(`backend_health last_completion_at (${adapter.name})`);
  it.before(async (context) => {
    context.store = await adapter.open();
  });
  it.after(async ({ store }) => {
    await store.close();
  });

  it('the latest served completion per model; refusals, failures and not-run settlements leave it', async ({ store }) => {
    const events = [
      recorded(BackendFailed({ backend: 'completion', kind: 'engine_oom', consecutive_failures: 1, at: t(0) }), { streamId: backendStream('lc-a'), streamVersion: 1 }),
      onMeter(settlement('r1', 'lc-a', 5)),
      onMeter(settlement('r2', 'lc-a', 9)),
      onMeter(settlement('r3', 'lc-a', 7)), // settled later in the log, but earlier in time: the greatest time stays
      onMeter(settlement('r4', 'lc-a', 20, { status: 502, basis: 'engine_usage' })), // failed at the engine
      onMeter(settlement('r5', 'lc-a', 21, { status: 503, basis: 'not_run' })), // never reached the engine
      onMeter(settlement('r6', 'lc-b', 3, { status: 200, disconnected: true, basis: 'relayed_frames', generated_output_tokens: 2, relayed_output_tokens: 1 })),
      onMeter(settlement('r7', 'lc-b', 4, { status: 200, basis: 'not_run' })), // a client that left during a boot
      onMeter(late('r8', 'lc-c', 11)),
      onMeter(settlement('r9', null, 30)),
    ];
    const rows = norm(await applyTwice(store, backendHealthProjection, events, query(['lc-a', 'lc-b', 'lc-c'])));
    assert.equal(rows, [
      { model_id: 'lc-a', backend: 'completion', breaker_state: 'closed', consecutive_failures: 1, last_completion_at: t(9), updated_at: t(0) },
      { model_id: 'lc-b', backend: 'completion', breaker_state: 'closed', consecutive_failures: 0, last_completion_at: t(3), updated_at: t(3) },
      { model_id: 'lc-c', backend: 'completion', breaker_state: 'closed', consecutive_failures: 0, last_completion_at: t(11), updated_at: t(11) },
    ]);
    const latest = await lastCompletions(store);
    assert.is(latest.get('lc-a'), Date.parse(t(9)));
    assert.is(latest.get('lc-b'), Date.parse(t(3)));
  });

  it('the same rows however the log is cut into batches', async ({ store }) => {
    const events = [
      onMeter(settlement('s1', 'lc-d', 4)),
      onMeter(settlement('s2', 'lc-d', 2)),
      recorded(BackendFailed({ backend: 'completion', kind: 'timeout', consecutive_failures: 1, at: t(6) }), { streamId: backendStream('lc-d'), streamVersion: 1 }),
      onMeter(settlement('s3', 'lc-d', 8)),
      onMeter(settlement('s4', 'lc-e', 5)),
      onMeter(settlement('s5', 'lc-e', 1)),
    ];
    const whole = norm(await applyTwice(store, backendHealthProjection, events, query(['lc-d', 'lc-e'])));
    await store.query("DELETE FROM backend_health WHERE model_id IN ('lc-d', 'lc-e')");
    for (const event of events) await store.transaction((tx) => backendHealthProjection.apply([event], tx));
    const { rows } = await store.query<Record<string, unknown>>(query(['lc-d', 'lc-e']));
    assert.equal(norm(rows), whole);
    assert.equal(whole, [
      { model_id: 'lc-d', backend: 'completion', breaker_state: 'closed', consecutive_failures: 1, last_completion_at: t(8), updated_at: t(6) },
      { model_id: 'lc-e', backend: 'completion', breaker_state: 'closed', consecutive_failures: 0, last_completion_at: t(5), updated_at: t(5) },
    ]);
  });

  it.run();
}
