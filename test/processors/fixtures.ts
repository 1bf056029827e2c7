/** Projections used by the runner's tests and benchmark: one set-based, one handler-per-event. */
import type { Projection } from '../../src/processors/index.ts';
import { defineEvent, defineProjection, eventCatalogue, Type, type EventOf, type Queryable } from '../../src/event-sourcing/index.ts';

const RequestSettled = defineEvent('RequestSettled', Type.Object({ tokens: Type.Integer() }));
const KeyPaused = defineEvent('KeyPaused', Type.Object({}, { additionalProperties: true }));
const fixtureEvents = eventCatalogue('fixture', [RequestSettled, KeyPaused]);
type FixtureEvent = EventOf<typeof RequestSettled> | EventOf<typeof KeyPaused>;

/** A ledger row per settled request plus per-stream totals, in one statement per batch. */
export const ledgerProjection: Projection = {
  name: 'test_ledger',
  tables: ['test_ledger_rows', 'test_ledger_totals'],
  eventTypes: ['RequestSettled'],
  async init(db) {
    await db.query(`CREATE TABLE IF NOT EXISTS test_ledger_rows (
      event_id uuid PRIMARY KEY, stream_id text NOT NULL, tokens integer NOT NULL, recorded_at timestamptz NOT NULL)`);
    await db.query(`CREATE TABLE IF NOT EXISTS test_ledger_totals (
      stream_id text PRIMARY KEY, requests bigint NOT NULL, tokens bigint NOT NULL)`);
  },
  async apply(events, db) {
    const rows = events.map((e) => ({ event_id: e.id, stream_id: e.streamId, tokens: (e.data as { tokens: number }).tokens, recorded_at: e.recordedAt }));
    // Totals grow only by ledger rows actually inserted, so replaying a batch changes nothing.
    await db.query(
      `WITH fresh AS (
         INSERT INTO test_ledger_rows (event_id, stream_id, tokens, recorded_at)
         SELECT event_id, stream_id, tokens, recorded_at FROM jsonb_to_recordset($1::jsonb)
           AS r(event_id uuid, stream_id text, tokens integer, recorded_at timestamptz)
         ON CONFLICT (event_id) DO NOTHING
         RETURNING stream_id, tokens)
       INSERT INTO test_ledger_totals AS t (stream_id, requests, tokens)
       SELECT stream_id, count(*), sum(tokens) FROM fresh GROUP BY stream_id
       ON CONFLICT (stream_id) DO UPDATE SET requests = t.requests + excluded.requests, tokens = t.tokens + excluded.tokens`,
      [JSON.stringify(rows)],
    );
  },
};

/** Last event type seen per stream, one upsert per event. */
export const lastEventProjection = defineProjection<FixtureEvent>({
  name: 'test_last_event',
  tables: ['test_last_event'],
  events: [fixtureEvents],
  async init(db) {
    await db.query(`CREATE TABLE IF NOT EXISTS test_last_event (stream_id text PRIMARY KEY, event_type text NOT NULL, stream_version bigint NOT NULL)`);
  },
  handlers: {
    async RequestSettled(event, db) {
      await upsertLast(db, event.streamId, event.type, event.streamVersion);
    },
    async KeyPaused(event, db) {
      await upsertLast(db, event.streamId, event.type, event.streamVersion);
    },
  },
});

async function upsertLast(db: Queryable, streamId: string, type: string, version: number): Promise<void> {
  await db.query(
    `INSERT INTO test_last_event AS t (stream_id, event_type, stream_version) VALUES ($1, $2, $3)
     ON CONFLICT (stream_id) DO UPDATE SET event_type = excluded.event_type, stream_version = excluded.stream_version
     WHERE t.stream_version < excluded.stream_version`,
    [streamId, type, version],
  );
}

export async function tableRows(db: Queryable, table: string): Promise<unknown[]> {
  const { rows } = await db.query(`SELECT * FROM ${table} ORDER BY 1`);
  return rows.map((r) => JSON.parse(JSON.stringify(r)));
}
