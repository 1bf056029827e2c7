/**
 * `key_usage`: per key, per month and per UTC day, tokens held by open reservations, tokens charged
 * (settled + expired), settled requests, expiries and rejections.
 *
 * Everything counts in the period of the meter stream it lands on, which is the day the reservation
 * was made: a settlement or an expiry always lands on its reservation's stream (the meter decider
 * settles and expires only there), even after midnight or at a month's turn. `CarriedHoldReleased`
 * (the next day's stream letting go of a hold carried over midnight) is not counted: the settlement on
 * the reservation's own stream already charged it, and the release only corrects the meter's
 * in-memory month balance. `MeterOpened`'s carried holds are not counted either, for the same reason.
 *
 * `foldKeyUsage` says the same thing in TypeScript over the log; `svc audit usage` compares the two.
 */
import { defineBatchProjection, type Queryable } from '../src/event-sourcing/index.ts';
import { meterEvents, type MeterEvent } from '../events/meter.ts';
import { advanceGuard, createInternalTable, useInternalSchema, closesEarlierHold, createPositionGuard, freshBatch, guardTable, isClose, logPlace, meterDayOf, outlivesBatch, pairWithinBatch, rowsWhere } from './meter-streams.ts';
import { describeTable } from './table-comments.ts';

export interface KeyUsageRow {
  key_id: string;
  period_kind: 'month' | 'day';
  period: string;
  reserved_tokens: number;
  input_tokens: number;
  output_tokens: number;
  requests: number;
  expired: number;
  rejected: number;
}

export type UsageDelta = Pick<KeyUsageRow, 'reserved_tokens' | 'input_tokens' | 'output_tokens' | 'requests' | 'expired' | 'rejected'>;
export const usageCounters = ['reserved_tokens', 'input_tokens', 'output_tokens', 'requests', 'expired', 'rejected'] as const satisfies readonly (keyof UsageDelta)[];

const holds = 'key_usage_holds';

const columns = 'stream_id text, type text, key_id text, month text, day text, request_id text, input_tokens bigint, output_tokens bigint, rtx bigint, rgp bigint';
const counterList = usageCounters.join(', ');

/**
 * Adds the rows of `deltas` (stream_id and the six counters, a CTE of the statement) to the month
 * and day rows of each stream's key, one upsert per row (summed first: a statement may touch a row once).
 */
const addDeltas = `
  INSERT INTO key_usage AS u (key_id, period_kind, period, period_start, ${counterList})
  SELECT s.key_id, p.kind, p.period, p.start, ${usageCounters.map((c) => `sum(d.${c})`).join(', ')}
  FROM deltas d
  JOIN (SELECT DISTINCT stream_id, key_id, month, day FROM fresh) s ON s.stream_id = d.stream_id
  CROSS JOIN LATERAL (VALUES ('month', s.month, (s.month || '-01')::date), ('day', s.day, s.day::date)) AS p(kind, period, start)
  GROUP BY s.key_id, p.kind, p.period, p.start
  ON CONFLICT (key_id, period_kind, period) DO UPDATE SET ${usageCounters.map((c) => `${c} = u.${c} + excluded.${c}`).join(', ')}`;

/** A deltas row of the stream: the counters in `usageCounters` order. */
const delta = (...values: string[]) => `SELECT stream_id, ${values.map((v, i) => `(${v})::bigint AS ${usageCounters[i]}`).join(', ')}`;

export const keyUsageProjection = defineBatchProjection<MeterEvent>({
  name: 'key_usage',
  tables: ['key_usage', holds, guardTable('key_usage')],
  events: [meterEvents],
  eventTypes: ['BudgetReserved', 'UsageSettled', 'ReservationExpired', 'RequestRejected'],
  async init(db) {
    await db.query(`CREATE TABLE IF NOT EXISTS key_usage (
      key_id text NOT NULL,
      period_kind text NOT NULL CHECK (period_kind IN ('month', 'day')),
      period text NOT NULL,
      reserved_tokens bigint NOT NULL DEFAULT 0,
      input_tokens bigint NOT NULL DEFAULT 0,
      output_tokens bigint NOT NULL DEFAULT 0,
      requests bigint NOT NULL DEFAULT 0,
      expired bigint NOT NULL DEFAULT 0,
      rejected bigint NOT NULL DEFAULT 0,
      -- last, where an older table gets it (below): a rebuild then swaps rows into the table in place
      period_start date NOT NULL,
      PRIMARY KEY (key_id, period_kind, period))`);
    // A table from before period_start: the column, filled in from period (YYYY-MM, or YYYY-MM-DD).
    await db.query(`DO $$ BEGIN
      IF NOT EXISTS (SELECT FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'key_usage' AND column_name = 'period_start') THEN
        ALTER TABLE key_usage ADD COLUMN period_start date;
        UPDATE key_usage SET period_start = (CASE period_kind WHEN 'month' THEN period || '-01' ELSE period END)::date;
        ALTER TABLE key_usage ALTER COLUMN period_start SET NOT NULL;
      END IF;
    END $$`);
    await db.query(`CREATE INDEX IF NOT EXISTS key_usage_period_start ON key_usage (period_kind, period_start)`);
    await describeTable(db, 'key_usage', 'Per key, per UTC month and per UTC day: tokens held and charged, requests, expiries, rejections (projection key_usage). A request counts in the period of its meter day, the day it was reserved.', {
      key_id: 'The key (its 12-hex prefix); api_keys.key_id.',
      period_kind: 'month or day.',
      period: 'The period as text, YYYY-MM for a month row, YYYY-MM-DD for a day row (UTC); kept for older queries: compare dates with period_start.',
      period_start: 'The period\'s first day (UTC): the 1st of the month for a month row, the day itself for a day row.',
      reserved_tokens: 'Tokens held now by open reservations made in the period (prompt + max_tokens x choices).',
      input_tokens: 'Input tokens charged: settled (the engine\'s usage) plus expired (the whole hold).',
      output_tokens: 'Output tokens charged: settled (the engine\'s usage) plus expired (the whole hold).',
      requests: 'Settled requests.',
      expired: 'Reservations expired by the reaper (their whole hold charged).',
      rejected: 'Requests rejected after authentication (charged nothing).',
    });
    await createInternalTable(db, holds, 'stream_id text COLLATE "C" NOT NULL, request_id text NOT NULL, tokens bigint NOT NULL, PRIMARY KEY (stream_id, request_id)');
    await createPositionGuard(db, 'key_usage');
  },
  // Two statements, in this order, as one event at a time would leave the rows (see `pairWithinBatch`):
  // holds made before the batch released by their close, with what every settlement and expiry
  // charged, and the rejections; then the holds still open at the batch's end (each remembered with its
  // size, so its release subtracts exactly what it added). A hold made and released within the batch
  // adds and subtracts the same tokens: it writes no row.
  async apply(events, db) {
    await useInternalSchema(db);
    const pairing = pairWithinBatch(events);
    const row = (e: (typeof events)[number], pos: number) => {
      const d = e.data as Partial<{ request_id: string; input_tokens: number; output_tokens: number }>;
      const { keyId, month, day } = meterDayOf(e.streamId);
      const { rtx, rgp } = pairing[pos];
      return { stream_id: e.streamId, type: e.type, key_id: keyId, month, day, request_id: d.request_id, input_tokens: d.input_tokens ?? 0, output_tokens: d.output_tokens ?? 0, ...logPlace(e), rtx, rgp };
    };
    // Each statement is sent the events it acts on: closes and rejections, then the reservations still open.
    const ended = rowsWhere(events, (e) => isClose(e) || e.type === 'RequestRejected', row);
    const opened = rowsWhere(events, (e, pos) => outlivesBatch(e, pairing[pos]), row);
    const fresh = freshBatch('key_usage', columns);
    if (ended !== '[]') {
      await db.query(
        `WITH ${fresh},
         released AS (
           DELETE FROM ${holds} h USING fresh f
           WHERE ${closesEarlierHold('f', 'key_usage')} AND h.stream_id = f.stream_id AND h.request_id = f.request_id
           RETURNING h.stream_id, h.tokens),
         deltas AS (
           ${delta('-tokens', '0', '0', '0', '0', '0')} FROM released
           UNION ALL
           ${delta('0', 'input_tokens', 'output_tokens', "(type = 'UsageSettled')::int", "(type = 'ReservationExpired')::int", '0')} FROM fresh WHERE type IN ('UsageSettled', 'ReservationExpired')
           UNION ALL
           ${delta('0', '0', '0', '0', '0', '1')} FROM fresh WHERE type = 'RequestRejected')
         ${addDeltas}`,
        [ended],
      );
    }
    if (opened !== '[]') {
      await db.query(
        `WITH ${fresh},
         held AS (
           INSERT INTO ${holds} (stream_id, request_id, tokens)
           SELECT stream_id, request_id, input_tokens + output_tokens FROM fresh
           ON CONFLICT DO NOTHING RETURNING stream_id, tokens),
         deltas AS (${delta('tokens', '0', '0', '0', '0', '0')} FROM held)
         ${addDeltas}`,
        [opened],
      );
    }
    await advanceGuard(db, 'key_usage', events);
  },
});

/** A stored meter event as the fold needs it. */
export interface MeterEventOnStream {
  streamId: string;
  type: string;
  data: unknown;
}

/**
 * The same rules as the projection, over events read from the log (in stream order): the rows
 * `key_usage` should hold for them, keyed `key_id|period_kind|period`.
 */
export function foldKeyUsage(events: Iterable<MeterEventOnStream>): Map<string, KeyUsageRow> {
  const rows = new Map<string, KeyUsageRow>();
  const openHolds = new Map<string, number>(); // `${stream}|${request}` -> tokens
  const add = (streamId: string, delta: Partial<UsageDelta>) => {
    const { keyId, month, day } = meterDayOf(streamId);
    for (const [kind, period] of [['month', month], ['day', day]] as const) {
      const id = `${keyId}|${kind}|${period}`;
      let row = rows.get(id);
      if (!row) {
        row = { key_id: keyId, period_kind: kind, period, reserved_tokens: 0, input_tokens: 0, output_tokens: 0, requests: 0, expired: 0, rejected: 0 };
        rows.set(id, row);
      }
      for (const counter of usageCounters) row[counter] += delta[counter] ?? 0;
    }
  };
  const release = (streamId: string, requestId: string): number => {
    const id = `${streamId}|${requestId}`;
    const tokens = openHolds.get(id) ?? 0;
    openHolds.delete(id);
    return tokens;
  };
  for (const event of events) {
    const e = event as MeterEventOnStream & MeterEvent;
    switch (e.type) {
      case 'BudgetReserved': {
        const id = `${e.streamId}|${e.data.request_id}`;
        if (openHolds.has(id)) break;
        const tokens = e.data.input_tokens + e.data.output_tokens;
        openHolds.set(id, tokens);
        add(e.streamId, { reserved_tokens: tokens });
        break;
      }
      case 'UsageSettled':
        add(e.streamId, { reserved_tokens: -release(e.streamId, e.data.request_id), input_tokens: e.data.input_tokens, output_tokens: e.data.output_tokens, requests: 1 });
        break;
      case 'ReservationExpired':
        add(e.streamId, { reserved_tokens: -release(e.streamId, e.data.request_id), input_tokens: e.data.input_tokens, output_tokens: e.data.output_tokens, expired: 1 });
        break;
      case 'RequestRejected':
        add(e.streamId, { rejected: 1 });
        break;
      default:
        break; // MeterOpened, ReservationRenewed, CarriedHoldReleased: no usage of their own (see above)
    }
  }
  return rows;
}

/** The key's `key_usage` rows for one month: the month row and its day rows. */
export async function keyUsageOfMonth(db: Queryable, keyId: string, month: string): Promise<KeyUsageRow[]> {
  const { rows } = await db.query<Record<string, string | number>>(
    `SELECT * FROM key_usage WHERE key_id = $1 AND period_start >= ($2 || '-01')::date AND period_start < ($2 || '-01')::date + interval '1 month'
     ORDER BY period_kind DESC, period_start`,
    [keyId, month],
  );
  return rows.map(toUsageRow);
}

export function toUsageRow(row: Record<string, unknown>): KeyUsageRow {
  const out = { key_id: String(row.key_id), period_kind: row.period_kind as 'month' | 'day', period: String(row.period) } as KeyUsageRow;
  for (const counter of usageCounters) out[counter] = Number(row[counter]);
  return out;
}
