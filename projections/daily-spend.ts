/**
 * `daily_spend`: per UTC day, what settled requests cost (GPU-seconds times each backend's price),
 * their GPU-seconds and their number. The spend cap reads today's row. A request counts on its meter
 * day (the day it was admitted), like everything else; expiries and rejections cost nothing here
 * (no backend time was reported for them).
 */
import { defineProjection, type Queryable } from '../src/event-sourcing/index.ts';
import { meterEvents, type MeterEvent } from '../events/meter.ts';
import { createStreamGuard, freshCte, meterDayOf } from './meter-streams.ts';

const guard = 'daily_spend_applied';

export const dailySpendProjection = defineProjection<MeterEvent>({
  name: 'daily_spend',
  tables: ['daily_spend', guard],
  events: [meterEvents],
  async init(db) {
    await db.query(`CREATE TABLE IF NOT EXISTS daily_spend (
      day date PRIMARY KEY, cost double precision NOT NULL, gpu_seconds double precision NOT NULL, requests bigint NOT NULL)`);
    await createStreamGuard(db, guard);
  },
  handlers: {
    async UsageSettled(event, db) {
      await db.query(
        `WITH ${freshCte(guard)}
         INSERT INTO daily_spend AS s (day, cost, gpu_seconds, requests) SELECT $3::date, $4::float8, $5::float8, 1 FROM fresh
         ON CONFLICT (day) DO UPDATE SET cost = s.cost + excluded.cost, gpu_seconds = s.gpu_seconds + excluded.gpu_seconds, requests = s.requests + 1`,
        [event.streamId, event.streamVersion, meterDayOf(event.streamId).day, event.data.cost, event.data.gpu_seconds],
      );
    },
  },
});

/** A day's spend so far (zeros when nothing settled yet). */
export async function spendOfDay(db: Queryable, day: string): Promise<{ cost: number; gpuSeconds: number; requests: number }> {
  const { rows } = await db.query<{ cost: number; gpu_seconds: number; requests: string | number }>('SELECT cost, gpu_seconds, requests FROM daily_spend WHERE day = $1::date', [day]);
  return rows.length === 0 ? { cost: 0, gpuSeconds: 0, requests: 0 } : { cost: Number(rows[0].cost), gpuSeconds: Number(rows[0].gpu_seconds), requests: Number(rows[0].requests) };
}
