/**
 * `usage_ledger`: one row per request that ended: settled, expired (its process died and the reaper
 * charged the whole hold) or rejected after authentication. Metadata only, never a prompt or a
 * completion. An expiry carries no request facts of its own, so the reservation's facts wait in
 * `usage_ledger_pending` until the request ends.
 */
import { defineProjection, type Recorded } from '../src/event-sourcing/index.ts';
import { meterEvents, type MeterEvent, type RequestFactsData } from '../events/meter.ts';
import { createStreamGuard, freshCte, meterDayOf } from './meter-streams.ts';

const guard = 'usage_ledger_applied';
const pending = 'usage_ledger_pending';

type LedgerRow = Record<string, string | number | boolean | null>;

function factsColumns(facts: RequestFactsData): LedgerRow {
  return {
    request_id: facts.request_id,
    key_prefix: facts.key_prefix,
    email: facts.email,
    client_ip: facts.client_ip,
    endpoint: facts.endpoint,
    model: facts.model,
    user_tag: facts.user,
    workload: facts.workload,
  };
}

function placeColumns(event: Recorded<MeterEvent>): LedgerRow {
  const { keyId, day } = meterDayOf(event.streamId);
  return { key_id: keyId, day };
}

// A request id is the row's key: the first outcome recorded for it wins (a later one, from a client
// reusing its X-Request-Id, is left out rather than overwriting; the events keep both).
const insertRow = (from: string) => `INSERT INTO usage_ledger SELECT r.* FROM ${from} ON CONFLICT (request_id) DO NOTHING`;

export const usageLedgerProjection = defineProjection<MeterEvent>({
  name: 'usage_ledger',
  tables: ['usage_ledger', pending, guard],
  events: [meterEvents],
  async init(db) {
    await db.query(`CREATE TABLE IF NOT EXISTS usage_ledger (
      request_id text PRIMARY KEY,
      key_id text NOT NULL,
      key_prefix text,
      email text,
      client_ip text,
      endpoint text,
      model text,
      user_tag text,
      workload text,
      input_tokens bigint NOT NULL,
      output_tokens bigint NOT NULL,
      status integer,
      latency_ms double precision,
      gpu_seconds double precision,
      cost double precision,
      outcome text NOT NULL CHECK (outcome IN ('settled', 'expired', 'rejected')),
      code text,
      disconnected boolean,
      day date NOT NULL,
      at timestamptz NOT NULL)`);
    await db.query(`CREATE INDEX IF NOT EXISTS usage_ledger_day_key ON usage_ledger (day, key_id)`);
    await db.query(`CREATE TABLE IF NOT EXISTS ${pending} (
      stream_id text COLLATE "C" NOT NULL, request_id text NOT NULL, facts jsonb NOT NULL, PRIMARY KEY (stream_id, request_id))`);
    await createStreamGuard(db, guard);
  },
  handlers: {
    async BudgetReserved(event, db) {
      await db.query(
        `WITH ${freshCte(guard)}
         INSERT INTO ${pending} (stream_id, request_id, facts) SELECT $1, $3, $4::jsonb FROM fresh ON CONFLICT DO NOTHING`,
        [event.streamId, event.streamVersion, event.data.request_id, JSON.stringify(factsColumns(event.data))],
      );
    },
    async UsageSettled(event, db) {
      const d = event.data;
      const row: LedgerRow = {
        ...factsColumns(d),
        ...placeColumns(event),
        input_tokens: d.input_tokens,
        output_tokens: d.output_tokens,
        status: d.status,
        latency_ms: d.latency_ms,
        gpu_seconds: d.gpu_seconds,
        cost: d.cost,
        outcome: 'settled',
        code: null,
        disconnected: d.disconnected,
        at: d.at,
      };
      await db.query(
        `WITH ${freshCte(guard)},
           done AS (DELETE FROM ${pending} p USING fresh WHERE p.stream_id = $1 AND p.request_id = $3)
         ${insertRow('fresh, jsonb_populate_record(NULL::usage_ledger, $4::jsonb) r')}`,
        [event.streamId, event.streamVersion, d.request_id, JSON.stringify(row)],
      );
    },
    async ReservationExpired(event, db) {
      const d = event.data;
      // Charged the whole hold; nothing ran to report a status, a latency or GPU time (NULL, not 0).
      const row: LedgerRow = { request_id: d.request_id, ...placeColumns(event), input_tokens: d.input_tokens, output_tokens: d.output_tokens, outcome: 'expired', at: d.at };
      await db.query(
        `WITH ${freshCte(guard)},
           facts AS (DELETE FROM ${pending} p USING fresh WHERE p.stream_id = $1 AND p.request_id = $3 RETURNING p.facts)
         ${insertRow(`fresh, jsonb_populate_record(NULL::usage_ledger, coalesce((SELECT facts FROM facts), '{}'::jsonb) || $4::jsonb) r`)}`,
        [event.streamId, event.streamVersion, d.request_id, JSON.stringify(row)],
      );
    },
    async RequestRejected(event, db) {
      const d = event.data;
      const row: LedgerRow = {
        ...factsColumns(d),
        ...placeColumns(event),
        input_tokens: d.input_tokens,
        output_tokens: 0,
        status: d.status,
        latency_ms: d.latency_ms,
        gpu_seconds: 0,
        cost: 0,
        outcome: 'rejected',
        code: d.code,
        disconnected: false,
        at: d.at,
      };
      await db.query(`WITH ${freshCte(guard)} ${insertRow('fresh, jsonb_populate_record(NULL::usage_ledger, $3::jsonb) r')}`, [
        event.streamId,
        event.streamVersion,
        JSON.stringify(row),
      ]);
    },
  },
});
