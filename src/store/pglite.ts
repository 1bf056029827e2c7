/** PGlite adapter: PostgreSQL compiled to WebAssembly, in this process, data under DATA_DIR. */
import { PGlite } from '@electric-sql/pglite';
import { join, resolve } from 'node:path';
import type { DriverTransaction, SqlDriver } from './driver.ts';

export interface PgliteDriverOptions {
  /** Directory holding the database files; null keeps the database in memory (tests). */
  dataDir: string | null;
}

export async function createPgliteDriver(options: PgliteDriverOptions): Promise<SqlDriver> {
  const db = options.dataDir === null ? await PGlite.create() : await PGlite.create(join(resolve(options.dataDir), 'pglite'));
  return {
    kind: 'pglite',
    // Every reader lives in this process and is woken directly; no NOTIFY needed.
    notifyChannel: null,
    // PGlite runs one statement at a time; batching still saves a statement per append.
    maxInFlight: 1,
    query: (sql, params) => db.query(sql, params as unknown[]) as never,
    // PGlite has no named statements; it is in this process, so there is no round trip to save.
    queryPrepared: (_name, sql, params) => db.query(sql, params) as never,
    transaction: (fn) =>
      db.transaction((tx) => {
        const wrapped: DriverTransaction = {
          query: (sql, params) => tx.query(sql, params as unknown[]) as never,
          queryPrepared: (_name, sql, params) => tx.query(sql, params) as never,
          exec: async (sql) => {
            await tx.exec(sql);
          },
        };
        return fn(wrapped);
      }),
    async listen() {},
    close: () => db.close(),
  };
}
