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
import { defineProjection, type Queryable, type Recorded } from '../src/event-sourcing/index.ts';
import { meterEvents, type MeterEvent } from '../events/meter.ts';
import { createStreamGuard, freshCte, meterDayOf } from './meter-streams.ts';

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

const guard = 'key_usage_applied';
const holds = 'key_usage_holds';

/**
 * Adds the delta read by `source` (a SELECT yielding the six counters, reading from `fresh`) to the
 * key's month row and day row. Parameters: $1 stream, $2 version, $3 key id, $4 month, $5 day.
 */
function addToPeriods(ctes: string, source: string): string {
  return `WITH ${freshCte(guard)}${ctes}
    INSERT INTO key_usage AS u (key_id, period_kind, period, ${usageCounters.join(', ')})
    SELECT $3, p.kind, p.period, ${usageCounters.map((c) => `d.${c}`).join(', ')}
    FROM (${source}) d CROSS JOIN (VALUES ('month', $4::text), ('day', $5::text)) AS p(kind, period)
    ON CONFLICT (key_id, period_kind, period) DO UPDATE SET ${usageCounters.map((c) => `${c} = u.${c} + excluded.${c}`).join(', ')}`;
}

function periodParams(event: Recorded<MeterEvent>): unknown[] {
  const { keyId, month, day } = meterDayOf(event.streamId);
  return [event.streamId, event.streamVersion, keyId, month, day];
}

// A hold's size is remembered per (stream, request) so its release subtracts exactly what it added.
const releaseHold = `,
  released AS (DELETE FROM ${holds} h USING fresh WHERE h.stream_id = $1 AND h.request_id = $6 RETURNING h.tokens)`;
const releasedTokens = `-coalesce((SELECT sum(tokens) FROM released), 0)::bigint`;

export const keyUsageProjection = defineProjection<MeterEvent>({
  name: 'key_usage',
  tables: ['key_usage', holds, guard],
  events: [meterEvents],
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
      PRIMARY KEY (key_id, period_kind, period))`);
    await db.query(`CREATE TABLE IF NOT EXISTS ${holds} (
      stream_id text COLLATE "C" NOT NULL, request_id text NOT NULL, tokens bigint NOT NULL, PRIMARY KEY (stream_id, request_id))`);
    await createStreamGuard(db, guard);
  },
  handlers: {
    async BudgetReserved(event, db) {
      const tokens = event.data.input_tokens + event.data.output_tokens;
      await db.query(
        addToPeriods(
          `,
  held AS (INSERT INTO ${holds} (stream_id, request_id, tokens) SELECT $1, $6, $7::bigint FROM fresh ON CONFLICT DO NOTHING RETURNING tokens)`,
          'SELECT tokens AS reserved_tokens, 0 AS input_tokens, 0 AS output_tokens, 0 AS requests, 0 AS expired, 0 AS rejected FROM held',
        ),
        [...periodParams(event), event.data.request_id, tokens],
      );
    },
    async UsageSettled(event, db) {
      await db.query(
        addToPeriods(releaseHold, `SELECT ${releasedTokens} AS reserved_tokens, $7::bigint AS input_tokens, $8::bigint AS output_tokens, 1 AS requests, 0 AS expired, 0 AS rejected FROM fresh`),
        [...periodParams(event), event.data.request_id, event.data.input_tokens, event.data.output_tokens],
      );
    },
    async ReservationExpired(event, db) {
      await db.query(
        addToPeriods(releaseHold, `SELECT ${releasedTokens} AS reserved_tokens, $7::bigint AS input_tokens, $8::bigint AS output_tokens, 0 AS requests, 1 AS expired, 0 AS rejected FROM fresh`),
        [...periodParams(event), event.data.request_id, event.data.input_tokens, event.data.output_tokens],
      );
    },
    async RequestRejected(event, db) {
      await db.query(addToPeriods('', 'SELECT 0 AS reserved_tokens, 0 AS input_tokens, 0 AS output_tokens, 0 AS requests, 0 AS expired, 1 AS rejected FROM fresh'), periodParams(event));
    },
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
    `SELECT * FROM key_usage WHERE key_id = $1 AND ((period_kind = 'month' AND period = $2) OR (period_kind = 'day' AND period LIKE $2 || '-%'))
     ORDER BY period_kind DESC, period`,
    [keyId, month],
  );
  return rows.map(toUsageRow);
}

export function toUsageRow(row: Record<string, unknown>): KeyUsageRow {
  const out = { key_id: String(row.key_id), period_kind: row.period_kind as 'month' | 'day', period: String(row.period) } as KeyUsageRow;
  for (const counter of usageCounters) out[counter] = Number(row[counter]);
  return out;
}
