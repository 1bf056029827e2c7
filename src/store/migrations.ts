/**
 * Applies infra/migrations/*.sql in name order, each once, under a lock so concurrent starts are safe.
 * The record of what ran, `schema_migrations`, lives in the store's internal schema (internal-schema.ts)
 * since migration 004 moved it there; a new database starts it beside the log, where migrations 001 to
 * 003 expect it, and 004 moves it.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { packageRoot } from '../config/index.ts';
import type { DriverTransaction, SqlDriver } from './driver.ts';
import { internalSchemaOf, quoteIdent } from './internal-schema.ts';

export const migrationsDir = join(packageRoot, 'infra', 'migrations');

export interface Migrated {
  /** The store's internal schema (`<schema>_internal`). */
  internalSchema: string;
  /** The migrations this call applied. */
  applied: string[];
}

/** Where `schema_migrations` is now (internal schema first), as SQL names it; null: nowhere yet. */
async function migrationsTable(tx: DriverTransaction, home: string, internal: string): Promise<string | null> {
  const { rows } = await tx.query<{ t: string | null }>(`SELECT coalesce(to_regclass($1), to_regclass($2))::text AS t`, [
    `${quoteIdent(internal)}.schema_migrations`,
    `${quoteIdent(home)}.schema_migrations`,
  ]);
  return rows[0]?.t ?? null;
}

export async function migrate(driver: SqlDriver): Promise<Migrated> {
  const files = readdirSync(migrationsDir).filter((f) => f.endsWith('.sql')).sort();
  return driver.transaction(async (tx) => {
    await tx.query(`SELECT pg_advisory_xact_lock(hashtext('svc-event-store-migrations'))`);
    const { rows: [where] } = await tx.query<{ home: string | null; internal: string | null }>(
      `SELECT current_schema() AS home, ${internalSchemaOf('current_schema()')} AS internal`,
    );
    if (!where?.home || !where.internal) throw new Error('the event store needs a schema: none of the search_path exists');
    const { home, internal } = where as { home: string; internal: string };
    let table = await migrationsTable(tx, home, internal);
    if (!table) {
      table = `${quoteIdent(home)}.schema_migrations`;
      await tx.exec(`CREATE TABLE IF NOT EXISTS ${table} (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`);
    }
    const { rows } = await tx.query<{ name: string }>(`SELECT name FROM ${table}`);
    const applied = new Set(rows.map((r) => r.name));
    const fresh = files.filter((f) => !applied.has(f));
    for (const file of fresh) {
      await tx.exec(readFileSync(join(migrationsDir, file), 'utf8'));
      table = (await migrationsTable(tx, home, internal)) ?? table; // a migration may have moved it (004)
      await tx.query(`INSERT INTO ${table} (name) VALUES ($1)`, [file]);
    }
    return { internalSchema: internal, applied: fresh };
  });
}
