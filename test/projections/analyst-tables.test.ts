/**
 * The tables analysts query, as psql shows them: every table and column has a comment (`\dt+`, `\d+`
 * read pg_description), the analysts' schema holds only what they query (helper tables live in
 * `<schema>_internal`), and every example query of projections/README.md runs as written
 * against a populated store, so none can go stale.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { readFileSync } from 'node:fs';
import type { EventStore } from '../../src/store/index.ts';
import { ProjectionRunner } from '../../src/processors/index.ts';
import { projections } from '../../projections/index.ts';
import { adaptersUnderTest } from '../store/adapters.ts';
import { mixedWorkload } from '../support/meter-workload.ts';

/** What analysts query: the projections' tables and the log. */
const analystTables = ['api_keys', 'backend_health', 'daily_spend', 'events', 'harvest_jobs', 'harvest_shards', 'key_usage', 'meter_holds', 'usage_ledger'];
/** The store's own tables and the projections' helper tables, in `<schema>_internal`. */
const internalTables = ['daily_spend_position', 'key_usage_holds', 'key_usage_position', 'meter_holds_position', 'processor_leases', 'projection_checkpoints', 'schema_migrations', 'usage_ledger_pending', 'usage_ledger_position'];

/** The example SQL of projections/README.md (the tables for analysts), statement by statement. */
function readmeQueries(): string[] {
  const readme = readFileSync(new URL('../../projections/README.md', import.meta.url), 'utf8');
  assert.ok(readme.includes('## Metering tables'), 'projections/README.md documents the tables');
  const blocks = [...readme.matchAll(/```sql\n([\s\S]*?)```/g)].map((m) => m[1]);
  return blocks.flatMap((block) =>
    block
      .split(/;\s*\n/)
      .map((statement) => statement.replace(/^\s*--.*$/gm, '').trim())
      .filter((statement) => statement.length > 0),
  );
}

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore; runner: ProjectionRunner }>(`tables for analysts (${adapter.name})`);
  it.before(async (context) => {
    context.store = await adapter.open({ pollIntervalMs: 100 });
    context.runner = new ProjectionRunner({ store: context.store, projections, pollIntervalMs: 50 });
    await context.runner.start();
    await mixedWorkload(context.store);
    await context.runner.caughtUp();
  });
  it.after(async (context) => {
    await context.runner?.stop();
    await context.store?.close();
    await adapter.cleanup();
  });

  it('the analysts\' schema holds only the tables they query; the store\'s own and the helper tables live in <schema>_internal', async ({ store }) => {
    const { rows } = await store.query<{ schema: string; name: string }>(
      `SELECT n.nspname AS schema, c.relname AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
       WHERE c.relkind IN ('r', 'p', 'v', 'm') AND n.nspname IN (current_schema(), left(current_schema() || '_internal', 63)) ORDER BY 2`,
    );
    const { rows: home } = await store.query<{ schema: string }>('SELECT current_schema() AS schema');
    assert.equal(rows.filter((r) => r.schema === home[0].schema).map((r) => r.name), analystTables);
    assert.equal(rows.filter((r) => r.schema !== home[0].schema).map((r) => r.name), internalTables);
    assert.is(store.internalSchema, `${home[0].schema}_internal`);
  });

  it('\\dt+ and \\d+ explain every analyst table and column (pg_description)', async ({ store }) => {
    const { rows } = await store.query<{ table_name: string; column_name: string | null; description: string | null }>(
      `SELECT c.relname AS table_name, NULL AS column_name, obj_description(c.oid, 'pg_class') AS description
       FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ANY($1::text[])
       UNION ALL
       SELECT c.relname, a.attname, col_description(c.oid, a.attnum)
       FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
       WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ANY($1::text[])`,
      [analystTables],
    );
    assert.equal([...new Set(rows.map((r) => r.table_name))].sort(), analystTables);
    const bare = rows.filter((r) => !r.description?.trim()).map((r) => (r.column_name ? `${r.table_name}.${r.column_name}` : r.table_name));
    assert.equal(bare, [], 'tables or columns without a comment');
  });

  it('day columns are dates, money exact', async ({ store }) => {
    const { rows } = await store.query<{ name: string; type: string }>(
      `SELECT table_name || '.' || column_name AS name, data_type AS type FROM information_schema.columns
       WHERE table_schema = current_schema() AND (column_name IN ('day', 'period_start') OR column_name LIKE 'cost%' OR column_name LIKE '%_micros') ORDER BY 1`,
    );
    assert.equal(rows.map((r) => [r.name, r.type]), [
      ['daily_spend.cost', 'numeric'],
      ['daily_spend.cost_micros', 'bigint'],
      ['daily_spend.day', 'date'],
      ['key_usage.period_start', 'date'],
      ['meter_holds.day', 'date'],
      ['usage_ledger.cost', 'numeric'],
      ['usage_ledger.cost_micros', 'bigint'],
      ['usage_ledger.day', 'date'],
      ['usage_ledger.price_per_gpu_second_micros', 'bigint'],
    ]);
  });

  it('every example query of projections/README.md runs as written', async ({ store }) => {
    const queries = readmeQueries();
    assert.is(queries.length, 16, 'projections/README.md\'s example queries, every one found');
    for (const sql of queries) {
      await store.query(sql).catch((error: Error) => assert.unreachable(`README query failed: ${error.message}\n${sql}`));
    }
  });

  it.run();
}
