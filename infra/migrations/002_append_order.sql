-- The append function, hardened (issue 8). Same signature and outcomes as in 001; what changed:
-- * Appends are serialized per stream: each takes a transaction-level advisory lock per stream before its
--   first write, in one canonical order (by lock key), so two batches never wait on each other in a cycle
--   (no deadlock) and the transaction's id, taken at its first write, is taken under the locks: a stream's
--   later versions always belong to later transactions, so the global order agrees with stream versions.
-- * An append must be the first write of its transaction (or follow only the store's own appends in it),
--   and a later append of a transaction refuses a stream that a newer transaction has written since.
-- * A batch that names one stream twice is refused here, not only by the JavaScript side.
-- * The undo of a half-written append deletes only the rows that this append inserted (stream, version
--   and id), never another append's event that carries the same id.
-- * The function runs only at READ COMMITTED (it re-reads after a unique violation).
-- * No pg_notify here any more: a notifying commit takes a cluster-wide lock; the store sends one
--   coalesced NOTIFY per process after its commits instead (README, "Live subscriptions").

DROP FUNCTION IF EXISTS svc_append_batch(text[], bigint[], int[], int[], int[], uuid[], text[], jsonb, jsonb, text);

CREATE OR REPLACE FUNCTION svc_append_batch(
  p_streams text[], p_expected bigint[], p_counts int[],
  p_ev_append int[], p_ev_ord int[], p_ids uuid[], p_types text[], p_data jsonb, p_meta jsonb)
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
  v_xid xid8;
BEGIN
  IF current_setting('transaction_isolation') <> 'read committed' THEN
    RAISE EXCEPTION 'svc_append_batch runs at READ COMMITTED only, not %', current_setting('transaction_isolation')
      USING ERRCODE = 'SVA03';
  END IF;
  IF coalesce(array_length(p_streams, 1), 0) <> (SELECT count(DISTINCT s) FROM unnest(p_streams) AS s) THEN
    RAISE EXCEPTION 'an append batch names a stream more than once' USING ERRCODE = 'SVA00';
  END IF;
  -- The transaction id orders the global log; it is taken at the first write. An earlier write would have
  -- taken it before the stream locks below, and a newer transaction could then write a stream's earlier version.
  v_xid := pg_current_xact_id_if_assigned();
  IF v_xid IS NOT NULL AND v_xid::text IS DISTINCT FROM current_setting('svc.append_xid', true) THEN
    RAISE EXCEPTION 'an append must be the first write of its transaction (this one wrote something else first)'
      USING ERRCODE = 'SVA01';
  END IF;
  -- One lock per stream (two-key form: its own key space), taken in one order by every writer.
  PERFORM pg_advisory_xact_lock(1937138433, l.k)
  FROM (SELECT DISTINCT hashtext(s) AS k FROM unnest(p_streams) AS s ORDER BY 1) AS l;
  IF v_xid IS NOT NULL AND EXISTS (
    SELECT 1 FROM unnest(p_streams) AS s
    CROSS JOIN LATERAL (SELECT e.transaction_id FROM events e WHERE e.stream_id = s ORDER BY e.stream_version DESC LIMIT 1) AS last
    WHERE last.transaction_id > v_xid) THEN
    -- a later append of this transaction, whose id predates a newer writer of one of these streams
    RAISE EXCEPTION 'a stream of this append was written by a newer transaction since this transaction began writing; retry the transaction'
      USING ERRCODE = 'SVA02';
  END IF;

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
      -- (exactly the rows it inserted: another append in this transaction may hold one of these ids)
      DELETE FROM events e
      USING unnest(v_ids) WITH ORDINALITY AS o(id, ord)
      WHERE e.stream_id = p_streams[i] AND e.stream_version = v_rec.version - v_count + o.ord
        AND e.event_id = o.id AND e.transaction_id = pg_current_xact_id_if_assigned();
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

  -- lets a further append in this transaction pass the first-write check
  PERFORM set_config('svc.append_xid', coalesce(pg_current_xact_id_if_assigned()::text, ''), true);
  RETURN QUERY SELECT * FROM unnest(v_out);
END
$fn$;
