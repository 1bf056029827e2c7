/**
 * `usage_ledger`: one row per request that ended: settled, expired (its process died and the reaper
 * charged the whole hold) or rejected after authentication. Metadata only, never a prompt or a
 * completion. An expiry carries no request facts of its own, so the reservation's facts wait in
 * `usage_ledger_pending` until the request ends. A settlement that came after its hold expired
 * (LateUsageRecorded) completes the expiry's row: the charged tokens stay the expiry's, the real
 * usage goes to `late_input_tokens`/`late_output_tokens`, and the GPU time and its cost are filled in.
 * Money is exact: `cost_micros` (integer micro-units) and `cost` (the same as numeric(20, 6)). A stream
 * cut short records what was generated (billed) and what the client's socket took apart.
 */
import { defineBatchProjection, toStorableText, type Recorded } from '../src/event-sourcing/index.ts';
import { meterEvents, type MeterEvent, type RequestFactsData } from '../events/meter.ts';
import { advanceGuard, createInternalTable, useInternalSchema, closesEarlierHold, createPositionGuard, freshBatch, guardTable, isClose, logPlace, meterDayOf, outlivesBatch, pairWithinBatch, rowsWhere } from './meter-streams.ts';
import { describeTable } from './table-comments.ts';

const pending = 'usage_ledger_pending';

type LedgerRow = Record<string, string | number | boolean | null>;

/** Client strings as a text column can hold them (a NUL or a lone surrogate escaped as in the event log). */
const storable = (text: string | null): string | null => (text === null ? null : toStorableText(text));

function factsColumns(facts: RequestFactsData): LedgerRow {
  return {
    request_id: storable(facts.request_id),
    key_prefix: facts.key_prefix,
    email: storable(facts.email),
    client_ip: facts.client_ip,
    endpoint: facts.endpoint,
    model: storable(facts.model),
    user_tag: storable(facts.user),
    workload: facts.workload,
  };
}

/** What a settlement measured (a settled row's, and a late settlement's on its expired row): status, times, exact charge, basis. */
function measuredColumns(d: Extract<MeterEvent, { type: 'LateUsageRecorded' }>['data']) {
  return {
    status: d.status,
    latency_ms: d.latency_ms,
    gpu_seconds: d.gpu_seconds,
    cost: microsToDecimal(d.cost_micros),
    cost_micros: d.cost_micros,
    price_per_gpu_second_micros: d.price_per_gpu_second_micros,
    basis: d.basis,
    disconnected: d.disconnected,
  };
}

/** Micro-units as an exact decimal string for a numeric(20, 6) column. */
export function microsToDecimal(micros: number): string {
  return `${Math.trunc(micros / 1e6)}.${String(micros % 1e6).padStart(6, '0')}`;
}

/** The measured part of a request that ended with its facts (settled or rejected). */
interface Outcome {
  input_tokens: number;
  output_tokens: number;
  status: number;
  latency_ms: number;
  gpu_seconds: number;
  cost: string;
  cost_micros: number;
  price_per_gpu_second_micros: number | null;
  basis: string | null;
  outcome: 'settled' | 'rejected';
  code: string | null;
  disconnected: boolean;
  at: string;
  generated_output_tokens: number | null;
  relayed_output_tokens: number | null;
}

/**
 * The whole row of a request that ended with its facts: built by Object.assign, not by spreads (it is
 * built for every request, and `{ ...a, ...b, more }` makes V8 add each key on its own, many times slower).
 */
function endedRow(event: Recorded<MeterEvent>, facts: RequestFactsData, outcome: Outcome): LedgerRow {
  const { keyId, day } = meterDayOf(event.streamId);
  return Object.assign(factsColumns(facts), { key_id: keyId, day }, outcome);
}

// A request id is the row's key: the first outcome recorded for it wins (a later one, from a client
// reusing its X-Request-Id, is left out rather than overwriting; the events keep both).

/** What an event puts in the ledger: a reservation's facts (kept until its request ends), or the row of a request that ended. */
function rowOf(event: Recorded<MeterEvent>): LedgerRow {
  switch (event.type) {
    case 'BudgetReserved':
      return factsColumns(event.data);
    case 'UsageSettled': {
      const d = event.data;
      return endedRow(event, d, {
        input_tokens: d.input_tokens,
        output_tokens: d.output_tokens,
        ...measuredColumns(d),
        outcome: 'settled',
        code: null,
        at: d.at,
        generated_output_tokens: d.generated_output_tokens,
        relayed_output_tokens: d.relayed_output_tokens,
      });
    }
    case 'ReservationExpired': {
      // Charged the whole hold; nothing ran to report a status, a latency or GPU time (NULL, not 0).
      // Its facts come from the reservation (see apply).
      const d = event.data;
      const { keyId, day } = meterDayOf(event.streamId);
      return { request_id: d.request_id, key_id: keyId, day, input_tokens: d.input_tokens, output_tokens: d.output_tokens, outcome: 'expired', at: d.at };
    }
    case 'RequestRejected': {
      const d = event.data;
      return endedRow(event, d, {
        input_tokens: d.input_tokens,
        output_tokens: 0,
        status: d.status,
        latency_ms: d.latency_ms,
        gpu_seconds: 0,
        cost: microsToDecimal(0),
        cost_micros: 0,
        price_per_gpu_second_micros: null,
        basis: null,
        outcome: 'rejected',
        code: d.code,
        disconnected: false,
        at: d.at,
        generated_output_tokens: null,
        relayed_output_tokens: null,
      });
    }
    case 'LateUsageRecorded': {
      // What the expiry's row lacked: the real usage (apart from the tokens charged), the GPU time and its cost.
      const d = event.data;
      const { keyId, day } = meterDayOf(event.streamId);
      return {
        request_id: d.request_id,
        key_id: keyId,
        day,
        ...measuredColumns(d),
        late_input_tokens: d.input_tokens,
        late_output_tokens: d.output_tokens,
        late_at: d.at,
      };
    }
    default:
      throw new Error(`usage_ledger does not read ${event.type}`);
  }
}

export const usageLedgerProjection = defineBatchProjection<MeterEvent>({
  name: 'usage_ledger',
  tables: ['usage_ledger', pending, guardTable('usage_ledger')],
  events: [meterEvents],
  eventTypes: ['BudgetReserved', 'UsageSettled', 'ReservationExpired', 'RequestRejected', 'LateUsageRecorded'],
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
      cost numeric(20, 6),
      outcome text NOT NULL CHECK (outcome IN ('settled', 'expired', 'rejected')),
      code text,
      disconnected boolean,
      day date NOT NULL,
      at timestamptz NOT NULL,
      cost_micros bigint,
      price_per_gpu_second_micros bigint,
      basis text,
      late_input_tokens bigint,
      late_output_tokens bigint,
      late_at timestamptz,
      generated_output_tokens bigint,
      relayed_output_tokens bigint)`);
    // A table written before money was exact (cost a float): the new columns, its costs to the micro-unit (as the upcaster reads the events).
    await db.query(`DO $$ BEGIN
      IF NOT EXISTS (SELECT FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'usage_ledger' AND column_name = 'cost_micros') THEN
        ALTER TABLE usage_ledger ADD COLUMN cost_micros bigint, ADD COLUMN price_per_gpu_second_micros bigint, ADD COLUMN basis text,
          ADD COLUMN late_input_tokens bigint, ADD COLUMN late_output_tokens bigint, ADD COLUMN late_at timestamptz;
        UPDATE usage_ledger SET cost_micros = floor(cost * 1e6 + 0.5) WHERE cost IS NOT NULL;
        ALTER TABLE usage_ledger ALTER COLUMN cost TYPE numeric(20, 6) USING cost_micros / 1000000.0;
      END IF;
    END $$`);
    // A table written before a cut-short stream's generated and relayed tokens were recorded: the two columns, last, as CREATE has them
    // (NULL: not recorded). Checked first, so a table that has them takes no ALTER's lock.
    await db.query(`DO $$ BEGIN
      IF NOT EXISTS (SELECT FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'usage_ledger' AND column_name = 'generated_output_tokens') THEN
        ALTER TABLE usage_ledger ADD COLUMN generated_output_tokens bigint, ADD COLUMN relayed_output_tokens bigint;
      END IF;
    END $$`);
    await db.query(`CREATE INDEX IF NOT EXISTS usage_ledger_day_key ON usage_ledger (day, key_id)`);
    await describeTable(db, 'usage_ledger', 'One row per request that ended: settled, expired or rejected after authentication (projection usage_ledger). Metadata only, never a prompt or a completion.', {
      request_id: 'Primary key: the request (X-Request-Id); the first outcome recorded for an id wins.',
      key_id: 'The key (its 12-hex prefix); api_keys.key_id.',
      key_prefix: 'The key\'s prefix, as the request recorded it.',
      email: 'The key\'s user e-mail.',
      client_ip: 'The client\'s IP address.',
      endpoint: 'The route called, e.g. /v1/completions.',
      model: 'The model asked for.',
      user_tag: 'The request\'s user field.',
      workload: 'X-Svc-Workload when interactive or batch, else NULL.',
      input_tokens: 'Input tokens charged: settled, the engine\'s usage; expired, the whole hold; rejected, the prompt\'s tokens.',
      output_tokens: 'Output tokens charged: settled, per basis; expired, the whole hold; rejected, 0.',
      status: 'HTTP status (NULL when expired, unless a late settlement came).',
      latency_ms: 'Latency in milliseconds (NULL when expired, unless a late settlement came).',
      gpu_seconds: 'Backend GPU-seconds billed (0 when rejected, NULL when expired unless a late settlement came).',
      cost: 'The charge in currency units, exact: cost_micros / 1,000,000.',
      outcome: 'settled, expired or rejected.',
      code: 'The error code of a rejection, else NULL.',
      disconnected: 'The client left before the end (billed for what was generated); NULL when expired.',
      day: 'The meter day (UTC): the day the request was admitted.',
      at: 'When it ended (settled, expired or rejected).',
      cost_micros: 'The charge in integer micro-units: gpu_seconds x price_per_gpu_second_micros, rounded half up once.',
      price_per_gpu_second_micros: 'The price per GPU-second applied, in micro-units (NULL: rejected, expired without a late settlement, or settled before prices were recorded).',
      basis: 'What the tokens rest on: engine_usage, relayed_frames, whole_hold or not_run (NULL: as for the price).',
      late_input_tokens: 'On an expired row: the input tokens of a settlement that came after the expiry (input_tokens stays what the expiry charged).',
      late_output_tokens: 'On an expired row: the output tokens of a settlement that came after the expiry.',
      late_at: 'On an expired row: when the late settlement came.',
      generated_output_tokens:
        'A stream cut short (disconnected): the output tokens the engine generated as far as the gateway knows (its usage frame when it came, else the content frames received), what output_tokens bills; NULL for a stream that completed, a non-streaming request, or one settled before they were recorded.',
      relayed_output_tokens:
        'A stream cut short: the content frames the client\'s socket took (written to the response and acknowledged by their write callback before it closed), one token each; at most generated_output_tokens. NULL as for generated_output_tokens.',
    });
    await createInternalTable(db, pending, 'stream_id text COLLATE "C" NOT NULL, request_id text NOT NULL, facts jsonb NOT NULL, PRIMARY KEY (stream_id, request_id)');
    await createPositionGuard(db, 'usage_ledger');
  },
  // Two statements, in this order, as one event at a time would leave the rows (see `pairWithinBatch`):
  // one row per request that ended, in log order (the first outcome of a request id wins), an
  // expiry's row taking the facts its reservation put aside (before the batch) or wrote (in it); then
  // the facts of the reservations still open at the batch's end put aside. Settlements carry their
  // own facts, so a request reserved and settled within the batch puts nothing aside.
  async apply(events, db) {
    await useInternalSchema(db);
    const pairing = pairWithinBatch(events);
    // A reservation closed in the batch is sent only when an expiry closes it (the expiry's row takes its facts).
    const expiring = new Set(events.flatMap((e, pos) => (e.type === 'ReservationExpired' && pairing[pos].paired !== null ? [pairing[pos].paired] : [])));
    const row = (e: Recorded<MeterEvent>, pos: number) => {
      const { paired, rtx, rgp } = pairing[pos];
      return { pos, stream_id: e.streamId, type: e.type, request_id: (e.data as { request_id: string }).request_id, row: rowOf(e), ...logPlace(e), paired, rtx, rgp };
    };
    const fresh = freshBatch('usage_ledger', 'pos int, stream_id text, type text, request_id text, row json, paired int, rtx bigint, rgp bigint');
    const ended = rowsWhere(events, (e, pos) => isClose(e) || e.type === 'RequestRejected' || expiring.has(pos), row);
    if (ended !== '[]') {
      await db.query(
        `WITH ${fresh},
         ended AS (
           DELETE FROM ${pending} p USING fresh f
           WHERE ${closesEarlierHold('f', 'usage_ledger')} AND p.stream_id = f.stream_id AND p.request_id = f.request_id
           RETURNING p.stream_id, p.request_id, p.facts)
         INSERT INTO usage_ledger
         SELECT r.* FROM fresh f
         LEFT JOIN ended x ON f.type = 'ReservationExpired' AND x.stream_id = f.stream_id AND x.request_id = f.request_id
         LEFT JOIN fresh y ON f.type = 'ReservationExpired' AND y.pos = f.paired
         CROSS JOIN LATERAL json_populate_record(NULL::usage_ledger,
           CASE WHEN f.type = 'ReservationExpired' THEN (coalesce(x.facts, y.row::jsonb, '{}'::jsonb) || f.row::jsonb)::json ELSE f.row END) r
         WHERE f.type <> 'BudgetReserved'
         ORDER BY f.pos
         ON CONFLICT (request_id) DO NOTHING`,
        [ended],
      );
    }
    // A late settlement completes its expiry's row (inserted by the statement above when in the same batch), once.
    const late = rowsWhere(events, (e) => e.type === 'LateUsageRecorded', row);
    if (late !== '[]') {
      await db.query(
        `WITH ${fresh}
         UPDATE usage_ledger l SET status = r.status, latency_ms = r.latency_ms, gpu_seconds = r.gpu_seconds, cost = r.cost, cost_micros = r.cost_micros,
           price_per_gpu_second_micros = r.price_per_gpu_second_micros, basis = r.basis, disconnected = r.disconnected,
           late_input_tokens = r.late_input_tokens, late_output_tokens = r.late_output_tokens, late_at = r.late_at
         FROM fresh f CROSS JOIN LATERAL json_populate_record(NULL::usage_ledger, f.row) r
         WHERE l.request_id = f.request_id AND l.key_id = r.key_id AND l.outcome = 'expired' AND l.late_at IS NULL`,
        [late],
      );
    }
    const opened = rowsWhere(events, (e, pos) => outlivesBatch(e, pairing[pos]), row);
    if (opened !== '[]') {
      await db.query(
        `WITH ${fresh}
         INSERT INTO ${pending} (stream_id, request_id, facts)
         SELECT stream_id, request_id, row::jsonb FROM fresh ORDER BY pos ON CONFLICT DO NOTHING`,
        [opened],
      );
    }
    await advanceGuard(db, 'usage_ledger', events);
  },
});
