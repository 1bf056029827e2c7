/**
 * `meter_holds`: reservations still open, one row each, for the reaper (which expires those past
 * `expires_at` on their `stream_id`). Inserted by BudgetReserved, moved by ReservationRenewed, deleted
 * by the UsageSettled or ReservationExpired on the reservation's own stream. A hold carried over
 * midnight stays one row, under its own day's stream: MeterOpened's carried holds and
 * CarriedHoldReleased change nothing here.
 */
import { defineProjection, type Queryable } from '../src/event-sourcing/index.ts';
import { meterEvents, type MeterEvent } from '../events/meter.ts';
import { createStreamGuard, freshCte, meterDayOf } from './meter-streams.ts';

const guard = 'meter_holds_applied';

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

export const meterHoldsProjection = defineProjection<MeterEvent>({
  name: 'meter_holds',
  tables: ['meter_holds', guard],
  events: [meterEvents],
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
    await createStreamGuard(db, guard);
  },
  handlers: {
    async BudgetReserved(event, db) {
      const d = event.data;
      const { keyId, day } = meterDayOf(event.streamId);
      await db.query(
        `WITH ${freshCte(guard)}
         INSERT INTO meter_holds (request_id, key_id, stream_id, day, input_tokens, output_tokens, reserved_at, expires_at)
         SELECT $3, $4, $1, $5::date, $6::bigint, $7::bigint, $8::timestamptz, $9::timestamptz FROM fresh
         ON CONFLICT (request_id) DO NOTHING`,
        [event.streamId, event.streamVersion, d.request_id, keyId, day, d.input_tokens, d.output_tokens, d.at, d.expires_at],
      );
    },
    async ReservationRenewed(event, db) {
      // A carried hold may be renewed on the next day's stream: the row is found by its request id.
      await db.query(
        `WITH ${freshCte(guard)}
         UPDATE meter_holds h SET expires_at = $4::timestamptz FROM fresh WHERE h.request_id = $3 AND h.key_id = $5`,
        [event.streamId, event.streamVersion, event.data.request_id, event.data.expires_at, meterDayOf(event.streamId).keyId],
      );
    },
    async UsageSettled(event, db) {
      await closeHold(db, event.streamId, event.streamVersion, event.data.request_id);
    },
    async ReservationExpired(event, db) {
      await closeHold(db, event.streamId, event.streamVersion, event.data.request_id);
    },
  },
});

async function closeHold(db: Queryable, streamId: string, version: number, requestId: string): Promise<void> {
  await db.query(`WITH ${freshCte(guard)} DELETE FROM meter_holds h USING fresh WHERE h.request_id = $3 AND h.stream_id = $1`, [streamId, version, requestId]);
}

/** Holds whose TTL has passed at `now`, oldest first: what the reaper expires. */
export async function expiredHolds(db: Queryable, now: Date, limit = 1000): Promise<OpenHold[]> {
  const { rows } = await db.query<Record<string, unknown>>(
    `SELECT request_id, key_id, stream_id, to_char(day, 'YYYY-MM-DD') AS day, input_tokens, output_tokens, reserved_at, expires_at
     FROM meter_holds WHERE expires_at <= $1::timestamptz ORDER BY expires_at LIMIT $2`,
    [now.toISOString(), limit],
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
