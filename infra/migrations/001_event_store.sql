-- The event store: one global log and one checkpoint per projection.
-- Shared by the PostgreSQL and PGlite adapters; applied in file-name order, each file once.

CREATE TABLE IF NOT EXISTS events (
  global_position bigint GENERATED ALWAYS AS IDENTITY,
  -- readers order and checkpoint by (transaction_id, global_position) and only read rows whose
  -- transaction is older than every running one, so a slow early transaction is never skipped
  transaction_id  xid8 NOT NULL DEFAULT pg_current_xact_id(),
  -- byte-wise comparison: stream ids are identifiers, and the primary key is searched on every append
  -- (a linguistic collation, even C.UTF-8, costs a locale-aware comparison at every step of the search)
  stream_id       text COLLATE "C" NOT NULL,
  -- 1 for a stream's first event; a stream's version is its last event's
  stream_version  bigint NOT NULL,
  event_id        uuid NOT NULL,
  event_type      text NOT NULL,
  data            jsonb NOT NULL,
  metadata        jsonb NOT NULL DEFAULT '{}'::jsonb,
  recorded_at     timestamptz NOT NULL DEFAULT now(),
  -- the optimistic-concurrency guard: two writers cannot both put an event at one stream version
  PRIMARY KEY (stream_id, stream_version)
);
CREATE UNIQUE INDEX IF NOT EXISTS events_event_id ON events (event_id);
CREATE INDEX IF NOT EXISTS events_global_order ON events (transaction_id, global_position);

CREATE TABLE IF NOT EXISTS projection_checkpoints (
  name            text PRIMARY KEY,
  transaction_id  xid8 NOT NULL DEFAULT '0',
  global_position bigint NOT NULL DEFAULT 0,
  updated_at      timestamptz NOT NULL DEFAULT now()
);

DO $$ BEGIN
  CREATE TYPE svc_append_outcome AS (idx int, outcome text, version bigint, last_position bigint, last_tx text);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

-- Appends a batch of independent appends (group commit): one round trip and one commit serve many
-- callers. Each append succeeds, is recognised as an idempotent repeat, or fails on its own; one
-- append's failure never fails the others. Each stream appears at most once per batch.
--   p_streams[i], p_expected[i] (-1 any, -2 no_stream, -3 stream_exists, N >= 0), p_counts[i]: append i
--   p_ev_append[k], p_ev_ord[k], p_ids[k], p_types[k], p_data->k, p_meta->k: event k, the p_ev_ord[k]-th of
--   append p_ev_append[k] (data and metadata come as two JSON arrays: one parse each, no array-literal escaping)
-- Outcomes: ok, idempotent, conflict (version), duplicate (ids stored elsewhere), retry (an `any`
-- append lost a race with another process's append; send it again).
CREATE OR REPLACE FUNCTION svc_append_batch(
  p_streams text[], p_expected bigint[], p_counts int[],
  p_ev_append int[], p_ev_ord int[], p_ids uuid[], p_types text[], p_data jsonb, p_meta jsonb,
  p_channel text)
RETURNS SETOF svc_append_outcome
LANGUAGE plpgsql
-- Plan the statements below once per connection, not at every call: a custom plan per call (what the
-- plan cache picks for array parameters, whose sizes it sees only at run time) cost about 0.25 ms of
-- planning per batch, more than the work itself for small batches. The generic plan has the same shape.
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
  v_out svc_append_outcome[];
  v_all_ok boolean;
  v_rec svc_append_outcome;
  v_expected bigint;
  v_count int;
  v_ids uuid[];
  v_found bigint;
  v_in_place boolean;
  v_base bigint;
  v_last_version bigint;
  v_last_position bigint;
  v_last_tx text;
BEGIN
  -- The common path, one statement: read each stream's version, insert the events of the appends
  -- whose expected version holds. It is tried first as a plain INSERT in a subtransaction: ON CONFLICT
  -- costs a check of both unique indexes before each row and an extra WAL record per row (about a
  -- fifth of the function's time), and conflicts are rare. If a unique index refuses a row (another
  -- transaction got to a version or an event id first, or an `any` append repeats stored ids), the
  -- subtransaction is undone whole and the same statement runs again with ON CONFLICT DO NOTHING,
  -- which skips such rows rather than failing the batch; the appends they belong to are sorted out below.
  BEGIN
    WITH req AS (
      SELECT r.idx::int AS idx, r.stream_id, r.expected, r.n, coalesce(v.stream_version, 0) AS cur
      FROM unnest(p_streams, p_expected, p_counts) WITH ORDINALITY AS r(stream_id, expected, n, idx)
      LEFT JOIN LATERAL (
        SELECT e.stream_version FROM events e WHERE e.stream_id = r.stream_id ORDER BY e.stream_version DESC LIMIT 1
      ) v ON true
    ), decided AS (
      SELECT req.*, (expected = -1 OR (expected = -2 AND cur = 0) OR (expected = -3 AND cur > 0) OR expected = cur) AS ok
      FROM req
    ), ins AS (
      INSERT INTO events (stream_id, stream_version, event_id, event_type, data, metadata)
      SELECT d.stream_id, d.cur + ev.ord, ev.event_id, ev.event_type, ev.data, ev.metadata
      FROM ROWS FROM (unnest(p_ev_append), unnest(p_ev_ord), unnest(p_ids), unnest(p_types),
                      jsonb_array_elements(p_data), jsonb_array_elements(p_meta)) WITH ORDINALITY
             AS ev(append_idx, ord, event_id, event_type, data, metadata, k)
      JOIN decided d ON d.idx = ev.append_idx
      WHERE d.ok
      ORDER BY ev.k
      RETURNING events.stream_id, events.global_position, events.transaction_id
    ), written AS (
      SELECT i.stream_id, count(*) AS n, max(i.global_position) AS last_position, min(i.transaction_id::text) AS last_tx
      FROM ins i GROUP BY i.stream_id
    )
    SELECT array_agg(ROW(
        d.idx,
        CASE WHEN NOT d.ok THEN 'check' WHEN w.n = d.n THEN 'ok' ELSE 'raced' END,
        CASE WHEN d.ok THEN d.cur + d.n ELSE d.cur END,
        w.last_position, w.last_tx)::svc_append_outcome ORDER BY d.idx),
      bool_and(d.ok AND coalesce(w.n, 0) = d.n)
    INTO v_out, v_all_ok
    FROM decided d LEFT JOIN written w ON w.stream_id = d.stream_id;
  EXCEPTION WHEN unique_violation THEN
    WITH req AS (
      SELECT r.idx::int AS idx, r.stream_id, r.expected, r.n, coalesce(v.stream_version, 0) AS cur
      FROM unnest(p_streams, p_expected, p_counts) WITH ORDINALITY AS r(stream_id, expected, n, idx)
      LEFT JOIN LATERAL (
        SELECT e.stream_version FROM events e WHERE e.stream_id = r.stream_id ORDER BY e.stream_version DESC LIMIT 1
      ) v ON true
    ), decided AS (
      SELECT req.*, (expected = -1 OR (expected = -2 AND cur = 0) OR (expected = -3 AND cur > 0) OR expected = cur) AS ok
      FROM req
    ), ins AS (
      INSERT INTO events (stream_id, stream_version, event_id, event_type, data, metadata)
      SELECT d.stream_id, d.cur + ev.ord, ev.event_id, ev.event_type, ev.data, ev.metadata
      FROM ROWS FROM (unnest(p_ev_append), unnest(p_ev_ord), unnest(p_ids), unnest(p_types),
                      jsonb_array_elements(p_data), jsonb_array_elements(p_meta)) WITH ORDINALITY
             AS ev(append_idx, ord, event_id, event_type, data, metadata, k)
      JOIN decided d ON d.idx = ev.append_idx
      WHERE d.ok
      ORDER BY ev.k
      ON CONFLICT DO NOTHING
      RETURNING events.stream_id, events.global_position, events.transaction_id
    ), written AS (
      SELECT i.stream_id, count(*) AS n, max(i.global_position) AS last_position, min(i.transaction_id::text) AS last_tx
      FROM ins i GROUP BY i.stream_id
    )
    SELECT array_agg(ROW(
        d.idx,
        CASE WHEN NOT d.ok THEN 'check' WHEN w.n = d.n THEN 'ok' ELSE 'raced' END,
        CASE WHEN d.ok THEN d.cur + d.n ELSE d.cur END,
        w.last_position, w.last_tx)::svc_append_outcome ORDER BY d.idx),
      bool_and(d.ok AND coalesce(w.n, 0) = d.n)
    INTO v_out, v_all_ok
    FROM decided d LEFT JOIN written w ON w.stream_id = d.stream_id;
  END;

  -- The rare path: version mismatches (maybe idempotent repeats) and appends that lost a race.
  FOR i IN 1 .. CASE WHEN v_all_ok THEN 0 ELSE coalesce(array_length(v_out, 1), 0) END LOOP
    v_rec := v_out[i];
    CONTINUE WHEN v_rec.outcome = 'ok';
    v_expected := p_expected[i];
    v_count := p_counts[i];
    SELECT array_agg(p_ids[k] ORDER BY p_ev_ord[k]) INTO v_ids
    FROM generate_subscripts(p_ids, 1) AS k WHERE p_ev_append[k] = i;
    IF v_rec.outcome = 'raced' THEN
      -- undo the part of this append that did go in: an append is all or nothing
      DELETE FROM events WHERE event_id = ANY (v_ids) AND transaction_id = pg_current_xact_id();
    END IF;
    SELECT count(*),
           bool_and(x.stream_id = p_streams[i]) AND count(DISTINCT x.stream_version - o.ord) = 1,
           min(x.stream_version - o.ord), max(x.stream_version), max(x.global_position), max(x.transaction_id::text)
    INTO v_found, v_in_place, v_base, v_last_version, v_last_position, v_last_tx
    FROM unnest(v_ids) WITH ORDINALITY AS o(id, ord) JOIN events x ON x.event_id = o.id;
    IF v_found = v_count AND v_in_place
       AND (v_expected IN (-1, -3) OR (v_expected = -2 AND v_base = 0) OR v_base = v_expected) THEN
      v_rec.outcome := 'idempotent';
      v_rec.version := v_last_version;
      v_rec.last_position := v_last_position;
      v_rec.last_tx := v_last_tx;
    ELSIF v_found > 0 THEN
      v_rec.outcome := 'duplicate';
    ELSIF v_rec.outcome = 'raced' AND v_expected = -1 THEN
      v_rec.outcome := 'retry';
    ELSE
      v_rec.outcome := 'conflict';
    END IF;
    IF v_rec.outcome IN ('duplicate', 'retry', 'conflict') THEN
      SELECT coalesce(max(e.stream_version), 0) INTO v_rec.version FROM events e WHERE e.stream_id = p_streams[i];
      v_rec.last_position := NULL;
      v_rec.last_tx := NULL;
    END IF;
    v_out[i] := v_rec;
  END LOOP;

  -- wake-up hint for live readers in other processes; delivered at commit, merged per transaction
  IF p_channel IS NOT NULL THEN
    PERFORM pg_notify(p_channel, '');
  END IF;
  RETURN QUERY SELECT * FROM unnest(v_out);
END
$fn$;
