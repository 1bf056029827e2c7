-- The event store: one global log, one row per stream, one checkpoint per projection.
-- Shared by the PostgreSQL and PGlite adapters; applied in file-name order, each file once.

CREATE TABLE IF NOT EXISTS streams (
  stream_id  text PRIMARY KEY,
  -- number of events in the stream (the stream_version of its last event); 0 = no stream
  version    bigint NOT NULL
);

CREATE TABLE IF NOT EXISTS events (
  global_position bigint GENERATED ALWAYS AS IDENTITY,
  -- readers order and checkpoint by (transaction_id, global_position) and only read rows whose
  -- transaction is older than every running one, so a slow early transaction is never skipped
  transaction_id  xid8 NOT NULL DEFAULT pg_current_xact_id(),
  stream_id       text NOT NULL,
  stream_version  bigint NOT NULL,
  event_id        uuid NOT NULL,
  event_type      text NOT NULL,
  data            jsonb NOT NULL,
  metadata        jsonb NOT NULL DEFAULT '{}'::jsonb,
  recorded_at     timestamptz NOT NULL DEFAULT now(),
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

-- Appends a batch of independent appends (group commit) in one statement, so one round trip and
-- one commit serve many callers. Each append succeeds, is recognised as an idempotent repeat, or
-- conflicts on its own; a conflict in one append never fails the others.
-- p_appends: [{"s": stream_id, "k": "any"|"no_stream"|"stream_exists"|"exact", "v": expected,
--              "ev": [{"id": uuid, "type": text, "data": json, "meta": json}, ...]}, ...]
-- with each stream at most once per batch.
CREATE OR REPLACE FUNCTION svc_append_batch(p_appends jsonb, p_channel text)
RETURNS TABLE (idx bigint, outcome text, version bigint, last_position bigint, last_tx text)
LANGUAGE plpgsql AS $fn$
DECLARE
  v_current jsonb;
  v_ok boolean;
BEGIN
  -- First write of the transaction: create missing stream rows and lock every stream of the batch,
  -- in one sorted sweep so that concurrent batches cannot deadlock. Returns the current versions.
  WITH locked AS (
    INSERT INTO streams AS s (stream_id, version)
    SELECT a.doc->>'s', 0 FROM jsonb_array_elements(p_appends) AS a(doc) ORDER BY 1
    ON CONFLICT (stream_id) DO UPDATE SET version = s.version
    RETURNING s.stream_id, s.version
  )
  SELECT jsonb_object_agg(l.stream_id, l.version) INTO v_current FROM locked l;

  RETURN QUERY
  WITH req AS (
    SELECT a.i AS idx, a.doc->>'s' AS stream_id, a.doc->>'k' AS kind, (a.doc->>'v')::bigint AS expected,
           (v_current->>(a.doc->>'s'))::bigint AS cur, jsonb_array_length(a.doc->'ev') AS n, a.doc->'ev' AS evs
    FROM jsonb_array_elements(p_appends) WITH ORDINALITY AS a(doc, i)
  ), ev AS (
    SELECT r.idx, r.stream_id, r.cur, e.ord, (e.doc->>'id')::uuid AS event_id, e.doc
    FROM req r, jsonb_array_elements(r.evs) WITH ORDINALITY AS e(doc, ord)
  ), seen AS (
    -- events of this batch that are already stored: an idempotent repeat, or a reused id
    SELECT ev.idx, count(*) AS found,
           bool_and(x.stream_id = ev.stream_id) AND count(DISTINCT x.stream_version - ev.ord) = 1 AS in_place,
           min(x.stream_version - ev.ord) AS base, max(x.stream_version) AS last_version,
           max(x.global_position) AS last_position, max(x.transaction_id::text) AS last_tx
    FROM ev JOIN events x ON x.event_id = ev.event_id
    GROUP BY ev.idx
  ), decision AS (
    SELECT r.idx, r.stream_id, r.cur, r.n, s.last_version, s.last_position, s.last_tx,
      CASE
        WHEN s.found IS NULL THEN
          CASE WHEN r.kind = 'any' OR (r.kind = 'no_stream' AND r.cur = 0)
                 OR (r.kind = 'stream_exists' AND r.cur > 0) OR (r.kind = 'exact' AND r.cur = r.expected)
               THEN 'ok' ELSE 'conflict' END
        WHEN s.found = r.n AND s.in_place AND (r.kind IN ('any', 'stream_exists')
               OR (r.kind = 'no_stream' AND s.base = 0) OR (r.kind = 'exact' AND s.base = r.expected))
          THEN 'idempotent'
        ELSE 'duplicate'
      END AS outcome
    FROM req r LEFT JOIN seen s ON s.idx = r.idx
  ), ins AS (
    INSERT INTO events (stream_id, stream_version, event_id, event_type, data, metadata)
    SELECT ev.stream_id, ev.cur + ev.ord, ev.event_id, ev.doc->>'type', ev.doc->'data', coalesce(ev.doc->'meta', '{}'::jsonb)
    FROM ev JOIN decision d ON d.idx = ev.idx
    WHERE d.outcome = 'ok'
    ORDER BY ev.idx, ev.ord
    RETURNING events.stream_id, events.global_position, events.transaction_id
  ), upd AS (
    UPDATE streams s SET version = d.cur + d.n
    FROM decision d WHERE d.outcome = 'ok' AND s.stream_id = d.stream_id
    RETURNING s.stream_id
  ), written AS (
    SELECT i.stream_id, max(i.global_position) AS last_position, max(i.transaction_id::text) AS last_tx
    FROM ins i GROUP BY i.stream_id
  )
  SELECT d.idx, d.outcome,
         CASE d.outcome WHEN 'ok' THEN d.cur + d.n WHEN 'idempotent' THEN d.last_version ELSE d.cur END,
         CASE d.outcome WHEN 'ok' THEN w.last_position WHEN 'idempotent' THEN d.last_position END,
         CASE d.outcome WHEN 'ok' THEN w.last_tx WHEN 'idempotent' THEN d.last_tx END
  FROM decision d LEFT JOIN written w ON w.stream_id = d.stream_id
  ORDER BY d.idx;

  -- wake-up hint for live readers in other processes; delivered at commit, merged per transaction
  IF p_channel IS NOT NULL THEN
    PERFORM pg_notify(p_channel, '');
  END IF;
END
$fn$;
