/**
 * The workflow processor's index of scheduled inputs, in the SQL database beside the checkpoints and
 * leases: one row per timer in `workflow_timers` (the store's internal schema), so the lease holder
 * finds what is due, at start and after a takeover, without reading every instance's stream. The
 * instance's stream keeps the schedule itself (WorkflowInputScheduled) and, once given, the input
 * (WorkflowInputRecorded): the row is written and marked fired in the transactions that record those.
 * A fired row is kept a day (a schedule recorded again after a crash finds it fired), then dropped.
 */
import { internalTable, type Queryable, type SqlDatabase } from '../store/index.ts';

/** A scheduled input as the index keeps it. */
export interface TimerRow {
  readonly timerId: string;
  /** The instance's stream that scheduled it (the fired input's `streamId`). */
  readonly stream: string;
  readonly at: Date;
  readonly input: { readonly type: string; readonly schemaVersion: number; readonly data: unknown };
}

export interface TimerStore {
  /** Creates the table if missing. */
  ensure(db: Queryable): Promise<void>;
  /** Adds timers (one already known, fired or not, is left as it is). */
  schedule(tx: Queryable, workflow: string, timers: readonly TimerRow[]): Promise<void>;
  /** The unfired timers due at `now`, earliest first, and when the earliest one due later is (null: none). */
  due(db: Queryable, workflow: string, now: Date, limit: number): Promise<{ due: TimerRow[]; later: Date | null }>;
  /** When the earliest unfired timer is due (null: none pending). */
  next(db: Queryable, workflow: string): Promise<Date | null>;
  /** Marks timers fired at `now`, and drops those fired over a day before. */
  fired(tx: Queryable, workflow: string, timerIds: readonly string[], now: Date): Promise<void>;
}

const keptFiredMs = 24 * 3600_000;

export function sqlTimers(db: Pick<SqlDatabase, 'internalSchema'>): TimerStore {
  const table = internalTable(db, 'workflow_timers');
  const rowOf = (r: { timer_id: string; stream: string; due_at: Date | string; input: TimerRow['input'] | string }): TimerRow => {
    const input = typeof r.input === 'string' ? JSON.parse(r.input) : r.input;
    return { timerId: r.timer_id, stream: r.stream, at: new Date(r.due_at), input: { type: input.type, schemaVersion: input.schemaVersion, data: input.data } };
  };
  return {
    async ensure(db) {
      const exists = (await db.query<{ t: string | null }>('SELECT to_regclass($1)::text AS t', [table])).rows[0].t !== null;
      if (exists) return;
      await db
        .query(
          `CREATE TABLE IF NOT EXISTS ${table} (
             workflow text COLLATE "C" NOT NULL,
             timer_id text COLLATE "C" NOT NULL,
             stream text NOT NULL,
             due_at timestamptz NOT NULL,
             input jsonb NOT NULL,
             fired_at timestamptz,
             PRIMARY KEY (workflow, timer_id))`,
        )
        // Processes starting at once: the loser of the race in the catalogue finds the winner's table.
        .catch((error: { code?: string }) => {
          if (error.code !== '23505' && error.code !== '42P07') throw error;
        });
      // What is due (unfired, by time), and what was fired long enough ago to drop.
      for (const [name, columns, where] of [['workflow_timers_due', 'due_at', 'IS NULL'], ['workflow_timers_fired', 'fired_at', 'IS NOT NULL']]) {
        await db.query(`CREATE INDEX IF NOT EXISTS ${name} ON ${table} (workflow, ${columns}) WHERE fired_at ${where}`).catch((error: { code?: string }) => {
          if (error.code !== '23505' && error.code !== '42P07') throw error;
        });
      }
      await db.query(`COMMENT ON TABLE ${table} IS 'Inputs the workflows scheduled for themselves (timers), by workflow: when each is due, and when it fired. The schedule itself is on the workflow instance''s stream.'`);
    },
    async schedule(tx, workflow, timers) {
      if (timers.length === 0) return;
      await tx.query(
        `INSERT INTO ${table} (workflow, timer_id, stream, due_at, input)
         SELECT $1, t.timer_id, t.stream, t.due_at, t.input FROM jsonb_to_recordset($2::jsonb) AS t(timer_id text, stream text, due_at timestamptz, input jsonb)
         ON CONFLICT (workflow, timer_id) DO NOTHING`,
        [workflow, JSON.stringify(timers.map((t) => ({ timer_id: t.timerId, stream: t.stream, due_at: t.at.toISOString(), input: t.input })))],
      );
    },
    async due(db, workflow, now, limit) {
      // One statement: an idle round (nothing due) learns when to look again without a second query.
      const { rows } = await db.query<Omit<Parameters<typeof rowOf>[0], 'timer_id'> & { timer_id: string | null; later: Date | string | null }>(
        `SELECT l.later, d.timer_id, d.stream, d.due_at, d.input
         FROM (SELECT min(due_at) AS later FROM ${table} WHERE workflow = $1 AND fired_at IS NULL AND due_at > $2) l
         LEFT JOIN LATERAL (SELECT timer_id, stream, due_at, input FROM ${table} WHERE workflow = $1 AND fired_at IS NULL AND due_at <= $2 ORDER BY due_at, timer_id LIMIT $3) d ON true
         ORDER BY d.due_at, d.timer_id`,
        [workflow, now.toISOString(), limit],
      );
      const later = rows[0]?.later == null ? null : new Date(rows[0].later);
      return { due: rows.filter((r) => r.timer_id !== null).map((r) => rowOf(r as Parameters<typeof rowOf>[0])), later };
    },
    async next(db, workflow) {
      const { rows } = await db.query<{ due_at: Date | string | null }>(`SELECT min(due_at) AS due_at FROM ${table} WHERE workflow = $1 AND fired_at IS NULL`, [workflow]);
      return rows[0]?.due_at == null ? null : new Date(rows[0].due_at);
    },
    async fired(tx, workflow, timerIds, now) {
      await tx.query(`UPDATE ${table} SET fired_at = $3 WHERE workflow = $1 AND timer_id = ANY($2::text[]) AND fired_at IS NULL`, [workflow, timerIds, now.toISOString()]);
      await tx.query(`DELETE FROM ${table} WHERE workflow = $1 AND fired_at < $2`, [workflow, new Date(now.getTime() - keptFiredMs).toISOString()]);
    },
  };
}
