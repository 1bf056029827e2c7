-- The store's own tables leave the analysts' schema (issue 25): the processors' checkpoints and the
-- record of migrations move, rows, comments and indexes with them, to `<schema>_internal`, where the
-- projections' helper tables already live. The analysts' schema keeps the log (`events`) and the
-- projections' tables. The store's SQL names the moved tables qualified (src/store/internal-schema.ts);
-- svc_append_batch never touches them.

DO $$
DECLARE
  home text := current_schema();
  internal text := left(current_schema() || '_internal', 63);
  moved text;
BEGIN
  EXECUTE format('CREATE SCHEMA IF NOT EXISTS %I', internal);
  FOREACH moved IN ARRAY ARRAY['projection_checkpoints', 'schema_migrations'] LOOP
    IF to_regclass(format('%I.%I', home, moved)) IS NOT NULL AND to_regclass(format('%I.%I', internal, moved)) IS NULL THEN
      EXECUTE format('ALTER TABLE %I.%I SET SCHEMA %I', home, moved, internal);
    END IF;
  END LOOP;
END $$;
