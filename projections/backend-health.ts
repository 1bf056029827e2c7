/**
 * `backend_health`: one row per backend (a model's completion engine, or its separate activation
 * engine), from the backend streams: its circuit breaker's state and failures, and the latest boot
 * stage its platform published; and, from the meter streams, when the model's completion engine last
 * served a completion (a settlement with status 200 of a request that ran: a served completion is no
 * event of its own, and nothing more is appended on the request path for it). Every backend handler
 * writes the absolute values its event carries (never an increment), and the last completion is the
 * greatest time seen, so replaying the events in order ends on the same row, however often and
 * however the log is cut into batches.
 */
import { defineBatchProjection, toStorableText, type Queryable, type Recorded } from '../src/event-sourcing/index.ts';
import { backendEvents, backendStreamParts, type BackendEvent } from '../events/backend.ts';
import { meterEvents, type MeterEvent } from '../events/meter.ts';
import { describeTable } from './table-comments.ts';

type Settled = Extract<MeterEvent, { type: 'UsageSettled' | 'LateUsageRecorded' }>;
type Handled = BackendEvent | Settled;

/** A settlement of a completion the engine served: answered 200 (or left by its client part-way), and run (not refused before the engine). */
function servedCompletion(data: Settled['data']): data is Settled['data'] & { model: string } {
  return (data.status === 200 || data.disconnected) && data.basis !== 'not_run' && data.model !== null && data.endpoint === '/v1/completions';
}

/** Upserts the backend's row with these columns (the row is made, closed and without a boot stage, if missing). */
async function upsert(db: Queryable, event: Recorded<BackendEvent>, columns: Record<string, unknown>): Promise<void> {
  const parts = backendStreamParts(event.streamId);
  if (!parts) return;
  const names = [...Object.keys(columns), 'updated_at'];
  const values = [...Object.values(columns), event.data.at];
  const placeholders = names.map((_, i) => `$${i + 3}`);
  await db.query(
    `INSERT INTO backend_health (model_id, backend, ${names.join(', ')}) VALUES ($1, $2, ${placeholders.join(', ')})
     ON CONFLICT (model_id, backend) DO UPDATE SET ${names.map((n) => `${n} = excluded.${n}`).join(', ')}`,
    [parts.modelId, parts.backend, ...values],
  );
}

const backendHandlers: { [Type in BackendEvent['type']]: (e: Recorded<Extract<BackendEvent, { type: Type }>>, db: Queryable) => Promise<void> } = {
  BackendFailed: (e, db) => upsert(db, e, { consecutive_failures: e.data.consecutive_failures, last_failure_kind: toStorableText(e.data.kind), last_failure_at: e.data.at }),
  BackendFailuresCleared: (e, db) => upsert(db, e, { consecutive_failures: 0 }),
  BreakerOpened: (e, db) =>
    upsert(db, e, { breaker_state: 'open', consecutive_failures: e.data.consecutive_failures, last_failure_kind: toStorableText(e.data.last_failure_kind), opened_at: e.data.at, retry_at: e.data.retry_at }),
  BreakerHalfOpened: (e, db) => upsert(db, e, { breaker_state: 'half_open', retry_at: null }),
  ProbeStarted: (e, db) => upsert(db, e, { breaker_state: 'half_open', retry_at: null }),
  BreakerClosed: (e, db) => upsert(db, e, { breaker_state: 'closed', consecutive_failures: 0, opened_at: null, retry_at: null }),
  BootStagePublished: (e, db) => upsert(db, e, { boot_stage: e.data.stage, boot_stage_at: e.data.at, boot_reason: e.data.reason == null ? null : toStorableText(e.data.reason) }),
};

export const backendHealthProjection = defineBatchProjection<Handled>({
  name: 'backend_health',
  tables: ['backend_health'],
  events: [backendEvents, meterEvents],
  eventTypes: [...(Object.keys(backendHandlers) as BackendEvent['type'][]), 'UsageSettled', 'LateUsageRecorded'],
  async init(db) {
    await db.query(`CREATE TABLE IF NOT EXISTS backend_health (
      model_id text NOT NULL,
      backend text NOT NULL CHECK (backend IN ('completion', 'activation')),
      breaker_state text NOT NULL DEFAULT 'closed' CHECK (breaker_state IN ('closed', 'open', 'half_open')),
      consecutive_failures integer NOT NULL DEFAULT 0,
      last_failure_kind text NULL,
      last_failure_at timestamptz NULL,
      opened_at timestamptz NULL,
      retry_at timestamptz NULL,
      boot_stage text NULL,
      boot_stage_at timestamptz NULL,
      boot_reason text NULL,
      updated_at timestamptz NOT NULL,
      last_completion_at timestamptz NULL,
      PRIMARY KEY (model_id, backend)
    )`);
    // A table made before the column (an earlier build of this release); `svc projections rebuild backend_health` fills it from the log.
    await db.query('ALTER TABLE backend_health ADD COLUMN IF NOT EXISTS last_completion_at timestamptz NULL');
    await describeTable(db, 'backend_health', 'One row per backend (a model\'s completion engine, or its separate activation engine): circuit breaker and latest boot stage (projection backend_health, from the backend streams).', {
      model_id: 'The model id.',
      backend: 'completion (the engine serving completions, stream backend-<model_id>) or activation (a separate activation engine, stream backend-<model_id>:activation).',
      breaker_state: 'closed (requests flow), open (every request refused with 503 circuit_open until retry_at) or half_open (the cooldown is over: one probe request may go).',
      consecutive_failures: 'Failures in a row (a success after failures resets it to 0; the breaker opens at the configured threshold).',
      last_failure_kind: 'The last failure: upstream_unreachable, upstream_server_error, engine_oom, engine_engine_dead or timeout; NULL before any.',
      last_failure_at: 'When the last failure happened.',
      opened_at: 'When the breaker last opened; NULL once closed.',
      retry_at: 'While open: when the cooldown ends and one probe may go; NULL otherwise.',
      boot_stage: 'The latest boot stage published: waiting_for_gpu, container_started, weights_loading, weights_loaded, engine_ready, serving or failed; NULL if none ever was.',
      boot_stage_at: 'When that boot stage was published.',
      boot_reason: 'Why a boot failed (stage failed), else NULL.',
      updated_at: 'The last backend-stream event applied to the row (for a row made by a completion before any such event: that completion\'s settlement time).',
      last_completion_at: 'When the model\'s engine last served a completion (completion rows only): the settlement time of the latest request answered 200 that ran, across every gateway process (from UsageSettled and LateUsageRecorded on the meter streams). NULL before any; metered requests only (SVC_METERING=off records no settlements). /health\'s last_completion_at reads it.',
    });
  },
  // Backend events one at a time, in log order (each writes absolute values); the batch's served
  // completions then in one upsert per model, keeping the greatest time (order does not matter).
  async apply(events, db) {
    const served = new Map<string, { first: number; last: number }>();
    for (const e of events) {
      if (e.type === 'UsageSettled' || e.type === 'LateUsageRecorded') {
        if (!servedCompletion(e.data)) continue;
        const at = Date.parse(e.data.at);
        const seen = served.get(e.data.model);
        if (!seen) served.set(e.data.model, { first: at, last: at });
        else seen.last = Math.max(seen.last, at); // `first`: the first in log order, as applying one event at a time would make the row
      } else {
        await (backendHandlers[e.type] as (e: Recorded<BackendEvent>, db: Queryable) => Promise<void>)(e, db);
      }
    }
    for (const [modelId, { first, last }] of served) {
      await db.query(
        `INSERT INTO backend_health (model_id, backend, last_completion_at, updated_at) VALUES ($1, 'completion', $2, $3)
         ON CONFLICT (model_id, backend) DO UPDATE SET last_completion_at = GREATEST(backend_health.last_completion_at, excluded.last_completion_at)`,
        [modelId, new Date(last).toISOString(), new Date(first).toISOString()],
      );
    }
  },
});

/** A backend's row as the status route and operators read it. */
export interface BackendHealthRow {
  model_id: string;
  backend: 'completion' | 'activation';
  breaker_state: 'closed' | 'open' | 'half_open';
  consecutive_failures: number;
  last_failure_kind: string | null;
  last_failure_at: Date | null;
  opened_at: Date | null;
  retry_at: Date | null;
  boot_stage: string | null;
  boot_stage_at: Date | null;
  boot_reason: string | null;
  updated_at: Date;
  last_completion_at: Date | null;
}

/** Every backend's row (one query; a handful of rows). */
export async function backendHealthRows(db: Queryable): Promise<BackendHealthRow[]> {
  const { rows } = await db.query<BackendHealthRow>('SELECT * FROM backend_health ORDER BY model_id, backend');
  return rows;
}

/** When each model's completion engine last served a completion, across every process (one query; a handful of rows). */
export async function lastCompletions(db: Queryable): Promise<Map<string, number>> {
  const { rows } = await db.query<{ model_id: string; last_completion_at: Date | string }>(
    "SELECT model_id, last_completion_at FROM backend_health WHERE backend = 'completion' AND last_completion_at IS NOT NULL",
  );
  return new Map(rows.map((r) => [r.model_id, new Date(r.last_completion_at).getTime()]));
}
