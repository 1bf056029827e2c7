-- What the store's own tables are, for `\dt+` and `\d+` in psql (the projections comment theirs in
-- their init). Comments only: no table changes.

COMMENT ON TABLE events IS 'The event log: one row per event, never updated or deleted. Order: (transaction_id, global_position).';
COMMENT ON COLUMN events.global_position IS 'Identity; with transaction_id, the global order.';
COMMENT ON COLUMN events.transaction_id IS 'The appending transaction; readers order by (transaction_id, global_position).';
COMMENT ON COLUMN events.stream_id IS 'The stream: key-<keyId>, meter-<keyId>-<yyyy-mm-dd>, backend-<modelId>, harvest-<jobId>, ...';
COMMENT ON COLUMN events.stream_version IS '1 for a stream''s first event; unique per stream (primary key with stream_id).';
COMMENT ON COLUMN events.event_id IS 'Unique; re-appending the same id is idempotent.';
COMMENT ON COLUMN events.event_type IS 'The event type, e.g. KeyIssued, BudgetReserved, UsageSettled.';
COMMENT ON COLUMN events.data IS 'The event''s fields (metadata only: never a prompt or a completion).';
COMMENT ON COLUMN events.metadata IS 'Request id, key prefix, client IP, schema_version, ...';
COMMENT ON COLUMN events.recorded_at IS 'The database clock when the appending transaction began.';

COMMENT ON TABLE projection_checkpoints IS 'One row per projection or workflow: the last event of the log it applied.';
COMMENT ON COLUMN projection_checkpoints.name IS 'The projection or workflow (e.g. usage_ledger).';
COMMENT ON COLUMN projection_checkpoints.transaction_id IS 'With global_position, the last event applied.';
COMMENT ON COLUMN projection_checkpoints.global_position IS 'With transaction_id, the last event applied.';
COMMENT ON COLUMN projection_checkpoints.updated_at IS 'When the checkpoint last moved.';

COMMENT ON TABLE schema_migrations IS 'The store''s SQL migrations (infra/migrations) applied, each once.';
COMMENT ON COLUMN schema_migrations.name IS 'The migration file.';
COMMENT ON COLUMN schema_migrations.applied_at IS 'When it was applied.';
