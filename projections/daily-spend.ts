/**
 * `daily_spend`: per UTC day, what settled requests cost (GPU-seconds times each backend's price, in
 * integer micro-units), their GPU-seconds and their number. The spend cap reads today's row. A request
 * counts on its meter day (the day it was admitted), like everything else; expiries and rejections
 * cost nothing here (no backend time was reported for them), but a settlement that came after its
 * hold expired (LateUsageRecorded) does: its GPU time was spent.
 */
import { defineBatchProjection, type Queryable } from '../src/event-sourcing/index.ts';
import { meterEvents, type MeterEvent } from '../events/meter.ts';
import { advanceGuard, useInternalSchema, createPositionGuard, freshBatch, guardTable, logPlace, meterDayOf } from './meter-streams.ts';
import { describeTable } from './table-comments.ts';

export const dailySpendProjection = defineBatchProjection<Extract<MeterEvent, { type: 'UsageSettled' | 'LateUsageRecorded' }>>({
  name: 'daily_spend',
  tables: ['daily_spend', guardTable('daily_spend')],
  events: [meterEvents],
  eventTypes: ['UsageSettled', 'LateUsageRecorded'],
  async init(db) {
    await db.query(`CREATE TABLE IF NOT EXISTS daily_spend (
      day date PRIMARY KEY, cost numeric(20, 6) NOT NULL, gpu_seconds double precision NOT NULL, requests bigint NOT NULL, cost_micros bigint NOT NULL)`);
    // A table written before money was exact (cost a float): its costs to the micro-unit, as the upcaster reads the events.
    await db.query(`DO $$ BEGIN
      IF NOT EXISTS (SELECT FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'daily_spend' AND column_name = 'cost_micros') THEN
        ALTER TABLE daily_spend ADD COLUMN cost_micros bigint;
        UPDATE daily_spend SET cost_micros = floor(cost * 1e6 + 0.5);
        ALTER TABLE daily_spend ALTER COLUMN cost_micros SET NOT NULL, ALTER COLUMN cost TYPE numeric(20, 6) USING cost_micros / 1000000.0;
      END IF;
    END $$`);
    await describeTable(db, 'daily_spend', 'Per UTC meter day: what settled requests cost (late settlements included), their GPU time and their number (projection daily_spend). The spend cap reads today\'s cost_micros.', {
      day: 'The meter day (UTC), the day each request was admitted.',
      cost: 'The day\'s cost in currency units, exact: cost_micros / 1,000,000.',
      gpu_seconds: 'Backend GPU-seconds billed.',
      requests: 'Settlements counted (late ones included).',
      cost_micros: 'The day\'s cost in integer micro-units of the currency unit (exact).',
    });
    await createPositionGuard(db, 'daily_spend');
  },
  // One upsert per day the batch touches. Money is summed exactly (integers); GPU seconds are floats,
  // whose sums depend on their order, and a day's totals must not depend on where batches are cut:
  // each day's sum starts from the stored row and adds the batch's settlements in log order
  // (`sum(... ORDER BY ...)` adds in that order), as one settlement at a time would.
  async apply(events, db) {
    await useInternalSchema(db);
    const batch = JSON.stringify(
      events.map((e, pos) => ({ pos, day: meterDayOf(e.streamId).day, cost_micros: e.data.cost_micros, gpu_seconds: e.data.gpu_seconds, ...logPlace(e) })),
    );
    await db.query(
      `WITH ${freshBatch('daily_spend', 'pos int, day date, cost_micros bigint, gpu_seconds float8')},
       summed AS (
         SELECT d.day, sum(v.cost_micros)::bigint AS cost_micros, sum(v.gpu_seconds ORDER BY v.pos) AS gpu_seconds, count(*) FILTER (WHERE v.pos >= 0) AS requests
         FROM (SELECT DISTINCT day FROM fresh) d
         CROSS JOIN LATERAL (
           SELECT -1 AS pos, s.cost_micros, s.gpu_seconds FROM daily_spend s WHERE s.day = d.day
           UNION ALL
           SELECT f.pos, f.cost_micros, f.gpu_seconds FROM fresh f WHERE f.day = d.day) v
         GROUP BY d.day)
       INSERT INTO daily_spend AS s (day, cost_micros, cost, gpu_seconds, requests) SELECT day, cost_micros, cost_micros / 1000000.0, gpu_seconds, requests FROM summed
       ON CONFLICT (day) DO UPDATE SET cost_micros = excluded.cost_micros, cost = excluded.cost, gpu_seconds = excluded.gpu_seconds, requests = s.requests + excluded.requests`,
      [batch],
    );
    await advanceGuard(db, 'daily_spend', events);
  },
});

/** A day's spend so far (zeros when nothing settled yet); `costMicros` is exact, `cost` its value in currency units. */
export async function spendOfDay(db: Queryable, day: string): Promise<{ costMicros: number; cost: number; gpuSeconds: number; requests: number }> {
  const { rows } = await db.query<{ cost_micros: string | number; gpu_seconds: number; requests: string | number }>(
    'SELECT cost_micros, gpu_seconds, requests FROM daily_spend WHERE day = $1::date',
    [day],
  );
  if (rows.length === 0) return { costMicros: 0, cost: 0, gpuSeconds: 0, requests: 0 };
  const costMicros = Number(rows[0].cost_micros);
  return { costMicros, cost: costMicros / 1e6, gpuSeconds: Number(rows[0].gpu_seconds), requests: Number(rows[0].requests) };
}
