/**
 * The store's own tables live in `<schema>_internal` (migration 004): a database of an older release,
 * whose checkpoints and record of migrations sit beside the log, is upgraded in place, rows and all,
 * and a new one never has them in the analysts' schema.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { rmSync } from 'node:fs';
import { internalTable, openEventStore, type EventStore } from '../../src/store/index.ts';
import { adaptersUnderTest } from './adapters.ts';
import { freshDataDir } from '../support/data-dir.ts';

/** Where the store's own tables are: schema name by table. */
async function homes(store: EventStore): Promise<Record<string, string>> {
  const { rows } = await store.query<{ name: string; schema: string }>(
    `SELECT c.relname AS name, n.nspname AS schema FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.relkind = 'r' AND c.relname IN ('events', 'projection_checkpoints', 'schema_migrations')
       AND n.nspname IN (current_schema(), left(current_schema() || '_internal', 63)) ORDER BY 1`,
  );
  return Object.fromEntries(rows.map((r) => [r.name, r.schema]));
}

/** The layout of a release before migration 004: the store's tables beside the log, 004 not applied. */
async function downgrade(store: EventStore): Promise<void> {
  await store.query(`DO $$ BEGIN
      EXECUTE format('ALTER TABLE %I.projection_checkpoints SET SCHEMA %I', left(current_schema() || '_internal', 63), current_schema());
      EXECUTE format('ALTER TABLE %I.schema_migrations SET SCHEMA %I', left(current_schema() || '_internal', 63), current_schema());
    END $$`);
  await store.query(`DELETE FROM schema_migrations WHERE name = '004_internal_schema.sql'`);
  await store.query(`INSERT INTO projection_checkpoints (name, transaction_id, global_position) VALUES ('old_projection', '7', 42)`);
}

// PGlite's database, reopened by the tests, in a directory of its own: a copy of an empty one (initdb costs seconds of CPU).
const pgliteDir = await freshDataDir('svc-migrations-');
const reopenable = adaptersUnderTest().map((adapter) => {
  if (adapter.name === 'postgres') return { name: adapter.name, open: () => adapter.open(), cleanup: adapter.cleanup };
  const dir = pgliteDir;
  return { name: adapter.name, open: () => openEventStore({ dataDir: dir }), cleanup: async () => rmSync(dir, { recursive: true, force: true }) };
});

for (const adapter of reopenable) {
  const it = suite(`store migrations (${adapter.name})`);
  it.after(() => adapter.cleanup());

  it('a new store keeps its checkpoints and migrations in <schema>_internal, the log in the analysts\' schema', async () => {
    const store = await adapter.open();
    try {
      const { rows: [home] } = await store.query<{ schema: string }>('SELECT current_schema() AS schema');
      assert.is(store.internalSchema, `${home.schema}_internal`);
      assert.equal(await homes(store), { events: home.schema, projection_checkpoints: store.internalSchema, schema_migrations: store.internalSchema });
      const { rows } = await store.query<{ name: string }>(`SELECT name FROM ${internalTable(store, 'schema_migrations')} ORDER BY name`);
      assert.equal(rows.map((r) => r.name), ['001_event_store.sql', '002_append_order.sql', '003_table_comments.sql', '004_internal_schema.sql']);
    } finally {
      await store.close();
    }
  });

  it('a database of an older release: 004 moves the checkpoints and the migrations\' record with their rows and comments', async () => {
    const old = await adapter.open();
    try {
      await downgrade(old);
    } finally {
      await old.close();
    }
    const store = await adapter.open();
    try {
      const { rows: [home] } = await store.query<{ schema: string }>('SELECT current_schema() AS schema');
      assert.equal(await homes(store), { events: home.schema, projection_checkpoints: store.internalSchema, schema_migrations: store.internalSchema });
      const { rows: checkpoints } = await store.query(`SELECT name, transaction_id::text AS tx, global_position::int AS position FROM ${internalTable(store, 'projection_checkpoints')}`);
      assert.equal(checkpoints, [{ name: 'old_projection', tx: '7', position: 42 }]);
      const { rows: migrations } = await store.query<{ name: string }>(`SELECT name FROM ${internalTable(store, 'schema_migrations')} ORDER BY name`);
      assert.equal(migrations.map((r) => r.name).at(-1), '004_internal_schema.sql', 'recorded once, where the record now lives');
      assert.is(migrations.length, 4);
      const { rows: comments } = await store.query<{ c: string | null }>(`SELECT obj_description($1::regclass, 'pg_class') AS c`, [internalTable(store, 'projection_checkpoints')]);
      assert.match(comments[0].c ?? '', /One row per projection/);
    } finally {
      await store.close();
    }
  });

  it.run();
}
