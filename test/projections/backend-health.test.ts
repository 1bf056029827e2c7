/** backend_health over the backend streams: exact rows per backend, and idempotence (the same events applied twice). */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import type { EventStore } from '../../src/store/index.ts';
import { backendHealthProjection } from '../../projections/index.ts';
import { BackendFailed, BackendFailuresCleared, backendStream, BootStagePublished, BreakerClosed, BreakerHalfOpened, BreakerOpened, ProbeStarted } from '../../events/backend.ts';
import { adaptersUnderTest } from '../store/adapters.ts';
import { applyTwice, recorded } from '../support/projection-specification.ts';

const t = (s: number) => new Date(Date.parse('2026-11-26T12:00:00.000Z') + s * 1000).toISOString();
const query = `SELECT model_id, backend, breaker_state, consecutive_failures, last_failure_kind, last_failure_at, opened_at, retry_at, boot_stage, boot_stage_at, boot_reason, updated_at FROM backend_health ORDER BY model_id, backend`;
const opened = (n: number, s: number, reason: 'failures' | 'probe_failed' = 'failures') =>
  BreakerOpened({ backend: 'completion', reason, consecutive_failures: n, last_failure_kind: 'engine_oom', failure_threshold: 2, cooldown_ms: 60_000, retry_at: t(s + 60), at: t(s) });

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore }>(`backend_health projection (${adapter.name})`);
  it.before(async (context) => {
    context.store = await adapter.open();
  });
  it.after(async ({ store }) => {
    await store.close();
  });

  it('one row per backend: the breaker as its last event left it, and the latest boot stage', async ({ store }) => {
    const a = backendStream('bh-a');
    const aAct = backendStream('bh-a', 'activation');
    const b = backendStream('bh-b');
    const events = [
      recorded(BootStagePublished({ backend: 'completion', stage: 'weights_loading', at: t(0) }), { streamId: a, streamVersion: 1 }),
      recorded(BootStagePublished({ backend: 'completion', stage: 'serving', at: t(1), reason: null }), { streamId: a, streamVersion: 2 }),
      recorded(BackendFailed({ backend: 'completion', kind: 'upstream_server_error', consecutive_failures: 1, at: t(2) }), { streamId: a, streamVersion: 3 }),
      recorded(BackendFailed({ backend: 'completion', kind: 'engine_oom', consecutive_failures: 2, at: t(3) }), { streamId: a, streamVersion: 4 }),
      recorded(opened(2, 3), { streamId: a, streamVersion: 5 }),
      recorded(BootStagePublished({ backend: 'activation', stage: 'failed', at: t(4), reason: 'exited with code 1' }), { streamId: aAct, streamVersion: 1 }),
      recorded(BackendFailed({ backend: 'completion', kind: 'timeout', consecutive_failures: 1, at: t(5) }), { streamId: b, streamVersion: 1 }),
      recorded(BackendFailuresCleared({ backend: 'completion', cleared_failures: 1, at: t(6) }), { streamId: b, streamVersion: 2 }),
    ];
    const rows = await applyTwice(store, backendHealthProjection, events, query);
    const iso = (v: unknown) => (v === null ? null : new Date(v as string).toISOString());
    const norm = rows.map((r) => ({ ...r, last_failure_at: iso(r.last_failure_at), opened_at: iso(r.opened_at), retry_at: iso(r.retry_at), boot_stage_at: iso(r.boot_stage_at), updated_at: iso(r.updated_at) }));
    assert.equal(norm, [
      { model_id: 'bh-a', backend: 'activation', breaker_state: 'closed', consecutive_failures: 0, last_failure_kind: null, last_failure_at: null, opened_at: null, retry_at: null, boot_stage: 'failed', boot_stage_at: t(4), boot_reason: 'exited with code 1', updated_at: t(4) },
      { model_id: 'bh-a', backend: 'completion', breaker_state: 'open', consecutive_failures: 2, last_failure_kind: 'engine_oom', last_failure_at: t(3), opened_at: t(3), retry_at: t(63), boot_stage: 'serving', boot_stage_at: t(1), boot_reason: null, updated_at: t(3) },
      { model_id: 'bh-b', backend: 'completion', breaker_state: 'closed', consecutive_failures: 0, last_failure_kind: 'timeout', last_failure_at: t(5), opened_at: null, retry_at: null, boot_stage: null, boot_stage_at: null, boot_reason: null, updated_at: t(6) },
    ]);
  });

  it('half-open, the probe, and closing: the row follows each transition', async ({ store }) => {
    const c = backendStream('bh-c');
    const base = [
      recorded(BackendFailed({ backend: 'completion', kind: 'engine_oom', consecutive_failures: 1, at: t(0) }), { streamId: c, streamVersion: 1 }),
      recorded(opened(1, 0), { streamId: c, streamVersion: 2 }),
      recorded(BreakerHalfOpened({ backend: 'completion', at: t(60) }), { streamId: c, streamVersion: 3 }),
      recorded(ProbeStarted({ backend: 'completion', probe_id: 'p', expires_at: t(90), at: t(61) }), { streamId: c, streamVersion: 4 }),
    ];
    const row = async (events: typeof base) => (await applyTwice(store, backendHealthProjection, events, `SELECT breaker_state, consecutive_failures, opened_at IS NULL AS never_opened, retry_at FROM backend_health WHERE model_id = 'bh-c'`))[0];
    assert.equal(await row(base), { breaker_state: 'half_open', consecutive_failures: 1, never_opened: false, retry_at: null });
    const closed = recorded(BreakerClosed({ backend: 'completion', probe_id: 'p', at: t(62) }), { streamId: c, streamVersion: 5 });
    assert.equal(await row([...base, closed]), { breaker_state: 'closed', consecutive_failures: 0, never_opened: true, retry_at: null });
  });

  it.run();
}
