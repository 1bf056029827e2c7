/**
 * `daily_spend`: per UTC day, what settled requests cost (GPU-seconds times each backend's price),
 * their GPU-seconds and their number. The spend cap reads today's row. A request counts on its meter
 * day (the day it was admitted), like everything else; expiries and rejections cost nothing here
 * (no backend time was reported for them).
 */
import { defineBatchProjection, type Queryable } from '../src/event-sourcing/index.ts';
import { meterEvents, type MeterEvent } from '../events/meter.ts';
import { advanceGuard, createPositionGuard, freshBatch, guardTable, logPlace, meterDayOf } from './meter-streams.ts';

export const dailySpendProjection = defineBatchProjection<Extract<MeterEvent, { type: 'UsageSettled' }>>({
  name: 'daily_spend',
  tables: ['daily_spend', guardTable('daily_spend')],
  events: [meterEvents],
  eventTypes: ['UsageSettled'],
  async init(db) {
    await db.query(`CREATE TABLE IF NOT EXISTS daily_spend (
      day date PRIMARY KEY, cost double precision NOT NULL, gpu_seconds double precision NOT NULL, requests bigint NOT NULL)`);
    await createPositionGuard(db, 'daily_spend');
  },
  // One upsert per day the batch touches. Floating-point sums depend on their order, and a day's
  // totals must not depend on where batches are cut: each day's sum starts from the stored row and
  // adds the batch's settlements in log order (`sum(... ORDER BY ...)` adds in that order), as one
  // settlement at a time would.
  async apply(events, db) {
    const batch = JSON.stringify(
      events.map((e, pos) => ({ pos, day: meterDayOf(e.streamId).day, cost: e.data.cost, gpu_seconds: e.data.gpu_seconds, ...logPlace(e) })),
    );
    await db.query(
      `WITH ${freshBatch('daily_spend', 'pos int, day date, cost float8, gpu_seconds float8')},
       summed AS (
         SELECT d.day, sum(v.cost ORDER BY v.pos) AS cost, sum(v.gpu_seconds ORDER BY v.pos) AS gpu_seconds, count(*) FILTER (WHERE v.pos >= 0) AS requests
         FROM (SELECT DISTINCT day FROM fresh) d
         CROSS JOIN LATERAL (
           SELECT -1 AS pos, s.cost, s.gpu_seconds FROM daily_spend s WHERE s.day = d.day
           UNION ALL
           SELECT f.pos, f.cost, f.gpu_seconds FROM fresh f WHERE f.day = d.day) v
         GROUP BY d.day)
       INSERT INTO daily_spend AS s (day, cost, gpu_seconds, requests) SELECT day, cost, gpu_seconds, requests FROM summed
       ON CONFLICT (day) DO UPDATE SET cost = excluded.cost, gpu_seconds = excluded.gpu_seconds, requests = s.requests + excluded.requests`,
      [batch],
    );
    await advanceGuard(db, 'daily_spend', events);
  },
});

/** A day's spend so far (zeros when nothing settled yet). */
export async function spendOfDay(db: Queryable, day: string): Promise<{ cost: number; gpuSeconds: number; requests: number }> {
  const { rows } = await db.query<{ cost: number; gpu_seconds: number; requests: string | number }>('SELECT cost, gpu_seconds, requests FROM daily_spend WHERE day = $1::date', [day]);
  return rows.length === 0 ? { cost: 0, gpuSeconds: 0, requests: 0 } : { cost: Number(rows[0].cost), gpuSeconds: Number(rows[0].gpu_seconds), requests: Number(rows[0].requests) };
}
