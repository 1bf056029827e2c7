/**
 * `meter_holds`: reservations still open, one row each, for the reaper (which expires those past
 * `expires_at`, or whose process's slot lease lapsed, on their `stream_id`). Inserted by BudgetReserved, moved by ReservationRenewed, deleted
 * by the UsageSettled or ReservationExpired on the reservation's own stream. A hold carried over
 * midnight stays one row, under its own day's stream: MeterOpened's carried holds and
 * CarriedHoldReleased change nothing here.
 */
import { defineBatchProjection, type Queryable } from '../src/event-sourcing/index.ts';
import { meterEvents, type MeterEvent } from '../events/meter.ts';
import { advanceGuard, useInternalSchema, closesEarlierHold, createPositionGuard, freshBatch, guardTable, isClose, logPlace, meterDayOf, outlivesBatch, pairWithinBatch, rowsWhere } from './meter-streams.ts';
import { describeTable } from './table-comments.ts';

export interface OpenHold {
  requestId: string;
  keyId: string;
  streamId: string;
  day: string;
  inputTokens: number;
  outputTokens: number;
  reservedAt: Date;
  expiresAt: Date;
}

const columns = 'pos int, stream_id text, type text, key_id text, day text, request_id text, input_tokens bigint, output_tokens bigint, at text, expires_at text, rtx bigint, rgp bigint';

export const meterHoldsProjection = defineBatchProjection<MeterEvent>({
  name: 'meter_holds',
  tables: ['meter_holds', guardTable('meter_holds')],
  events: [meterEvents],
  eventTypes: ['BudgetReserved', 'ReservationRenewed', 'UsageSettled', 'ReservationExpired'],
  async init(db) {
    await db.query(`CREATE TABLE IF NOT EXISTS meter_holds (
      request_id text PRIMARY KEY,
      key_id text NOT NULL,
      stream_id text NOT NULL,
      day date NOT NULL,
      input_tokens bigint NOT NULL,
      output_tokens bigint NOT NULL,
      reserved_at timestamptz NOT NULL,
      expires_at timestamptz NOT NULL)`);
    await db.query('CREATE INDEX IF NOT EXISTS meter_holds_expires_at ON meter_holds (expires_at)');
    await describeTable(db, 'meter_holds', 'Reservations still open, one row each (projection meter_holds); the reaper expires those past expires_at on their stream.', {
      request_id: 'Primary key: the request (X-Request-Id).',
      key_id: 'The key (its 12-hex prefix).',
      stream_id: 'The reservation\'s meter stream, meter-<key>-<yyyy-mm-dd>: the reaper expires it there.',
      day: 'The reservation\'s meter day (UTC).',
      input_tokens: 'Prompt tokens held.',
      output_tokens: 'Output tokens held: max_tokens x choices.',
      reserved_at: 'When the hold was made.',
      expires_at: 'When the reaper may expire it (moved by each renewal).',
    });
    await createPositionGuard(db, 'meter_holds');
  },
  // In order, as one event at a time would leave them (see `pairWithinBatch`): holds made before the
  // batch closed on their own stream; holds still open at the batch's end made; then renewals, the
  // last of each request after its last reservation in the batch (an earlier one renewed a hold that
  // is gone; a carried hold may be renewed on the next day's stream, so it is found by request id).
  // A hold made and closed within the batch writes no row.
  async apply(events, db) {
    await useInternalSchema(db);
    const pairing = pairWithinBatch(events);
    // A renewal followed in the batch by a reservation under the same request id and key renewed a hold
    // that is gone by then: it must not move the new one.
    const superseded = events.map(() => false);
    const reservedLater = new Set<string>();
    for (let i = events.length - 1; i >= 0; i--) {
      const e = events[i];
      if (e.type !== 'BudgetReserved' && e.type !== 'ReservationRenewed') continue;
      const request = `${meterDayOf(e.streamId).keyId} ${e.data.request_id}`;
      if (e.type === 'BudgetReserved') reservedLater.add(request);
      else superseded[i] = reservedLater.has(request);
    }
    const row = (e: (typeof events)[number], pos: number) => {
      const d = e.data as Partial<{ request_id: string; input_tokens: number; output_tokens: number; at: string; expires_at: string }>;
      const { keyId, day } = meterDayOf(e.streamId);
      const { rtx, rgp } = pairing[pos];
      return { pos, stream_id: e.streamId, type: e.type, key_id: keyId, day, request_id: d.request_id, input_tokens: d.input_tokens, output_tokens: d.output_tokens, at: d.at, expires_at: d.expires_at, ...logPlace(e), rtx, rgp };
    };
    const fresh = freshBatch('meter_holds', columns);
    // Each statement is sent the events it acts on: closes, the reservations still open, the renewals that count.
    const closes = rowsWhere(events, isClose, row);
    if (closes !== '[]') {
      await db.query(
        `WITH ${fresh}
         DELETE FROM meter_holds h USING fresh f
         WHERE ${closesEarlierHold('f', 'meter_holds')} AND h.request_id = f.request_id AND h.stream_id = f.stream_id`,
        [closes],
      );
    }
    const opened = rowsWhere(events, (e, pos) => outlivesBatch(e, pairing[pos]), row);
    if (opened !== '[]') {
      await db.query(
        `WITH ${fresh}
         INSERT INTO meter_holds (request_id, key_id, stream_id, day, input_tokens, output_tokens, reserved_at, expires_at)
         SELECT request_id, key_id, stream_id, day::date, input_tokens, output_tokens, at::timestamptz, expires_at::timestamptz
         FROM fresh ORDER BY pos
         ON CONFLICT (request_id) DO NOTHING`,
        [opened],
      );
    }
    // Renewals are rare (a request running past half its TTL): a batch without one skips the statement.
    const renewals = rowsWhere(events, (e, pos) => e.type === 'ReservationRenewed' && !superseded[pos], row);
    if (renewals !== '[]') {
      await db.query(
        `WITH ${fresh}, renewed AS (
           SELECT DISTINCT ON (request_id, key_id) request_id, key_id, expires_at FROM fresh ORDER BY request_id, key_id, pos DESC)
         UPDATE meter_holds h SET expires_at = r.expires_at::timestamptz FROM renewed r WHERE h.request_id = r.request_id AND h.key_id = r.key_id`,
        [renewals],
      );
    }
    await advanceGuard(db, 'meter_holds', events);
  },
});

/**
 * What the reaper looks at, oldest expiry first: holds whose TTL has passed at `now`, and with
 * `madeBefore`, holds made before it, whose process's slot lease may have lapsed (the meter decider
 * judges that on the hold's stream).
 */
export async function expiredHolds(db: Queryable, now: Date, limit = 1000, madeBefore: Date | null = null): Promise<OpenHold[]> {
  const { rows } = await db.query<Record<string, unknown>>(
    `SELECT request_id, key_id, stream_id, to_char(day, 'YYYY-MM-DD') AS day, input_tokens, output_tokens, reserved_at, expires_at
     FROM meter_holds WHERE expires_at <= $1::timestamptz OR reserved_at <= $3::timestamptz ORDER BY expires_at LIMIT $2`,
    [now.toISOString(), limit, madeBefore?.toISOString() ?? '-infinity'],
  );
  return rows.map((r) => ({
    requestId: String(r.request_id),
    keyId: String(r.key_id),
    streamId: String(r.stream_id),
    day: String(r.day),
    inputTokens: Number(r.input_tokens),
    outputTokens: Number(r.output_tokens),
    reservedAt: new Date(r.reserved_at as string),
    expiresAt: new Date(r.expires_at as string),
  }));
}
