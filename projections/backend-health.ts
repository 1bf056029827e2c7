/**
 * `backend_health`: one row per backend (a model's completion engine, or its separate activation
 * engine), from the backend streams: its circuit breaker's state and failures, and the latest boot
 * stage its platform published. Every handler writes the absolute values its event carries (never an
 * increment), so replaying a stream's events in order ends on the same row, however often.
 */
import { defineProjection, toStorableText, type Queryable, type Recorded } from '../src/event-sourcing/index.ts';
import { backendEvents, backendStreamParts, type BackendEvent } from '../events/backend.ts';
import { describeTable } from './table-comments.ts';

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

export const backendHealthProjection = defineProjection<BackendEvent>({
  name: 'backend_health',
  tables: ['backend_health'],
  events: [backendEvents],
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
      PRIMARY KEY (model_id, backend)
    )`);
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
      updated_at: 'The last event applied to the row.',
    });
  },
  handlers: {
    BackendFailed: (e, db) => upsert(db, e, { consecutive_failures: e.data.consecutive_failures, last_failure_kind: toStorableText(e.data.kind), last_failure_at: e.data.at }),
    BackendFailuresCleared: (e, db) => upsert(db, e, { consecutive_failures: 0 }),
    BreakerOpened: (e, db) =>
      upsert(db, e, { breaker_state: 'open', consecutive_failures: e.data.consecutive_failures, last_failure_kind: toStorableText(e.data.last_failure_kind), opened_at: e.data.at, retry_at: e.data.retry_at }),
    BreakerHalfOpened: (e, db) => upsert(db, e, { breaker_state: 'half_open', retry_at: null }),
    ProbeStarted: (e, db) => upsert(db, e, { breaker_state: 'half_open', retry_at: null }),
    BreakerClosed: (e, db) => upsert(db, e, { breaker_state: 'closed', consecutive_failures: 0, opened_at: null, retry_at: null }),
    BootStagePublished: (e, db) => upsert(db, e, { boot_stage: e.data.stage, boot_stage_at: e.data.at, boot_reason: e.data.reason == null ? null : toStorableText(e.data.reason) }),
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
}

/** Every backend's row (one query; a handful of rows). */
export async function backendHealthRows(db: Queryable): Promise<BackendHealthRow[]> {
  const { rows } = await db.query<BackendHealthRow>('SELECT * FROM backend_health ORDER BY model_id, backend');
  return rows;
}
