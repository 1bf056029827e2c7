/** Applies infra/migrations/*.sql in name order, each once, under a lock so concurrent starts are safe. */
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { packageRoot } from '../config/index.ts';
import type { SqlDriver } from './driver.ts';

export const migrationsDir = join(packageRoot, 'infra', 'migrations');

export async function migrate(driver: SqlDriver): Promise<string[]> {
  const files = readdirSync(migrationsDir).filter((f) => f.endsWith('.sql')).sort();
  return driver.transaction(async (tx) => {
    await tx.query(`SELECT pg_advisory_xact_lock(hashtext('svc-event-store-migrations'))`);
    await tx.exec(`CREATE TABLE IF NOT EXISTS schema_migrations (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`);
    const { rows } = await tx.query<{ name: string }>('SELECT name FROM schema_migrations');
    const applied = new Set(rows.map((r) => r.name));
    const fresh = files.filter((f) => !applied.has(f));
    for (const file of fresh) {
      await tx.exec(readFileSync(join(migrationsDir, file), 'utf8'));
      await tx.query('INSERT INTO schema_migrations (name) VALUES ($1)', [file]);
    }
    return fresh;
  });
}
