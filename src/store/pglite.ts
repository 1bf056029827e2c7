/** PGlite adapter: PostgreSQL compiled to WebAssembly, in this process, data under DATA_DIR. */
import { PGlite, TransactionAbortedError, type postgresMod } from '@electric-sql/pglite';
import { NodeFS } from '@electric-sql/pglite/nodefs';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { createRequire } from 'node:module';
import { pathToFileURL } from 'node:url';
import type { DriverTransaction, SqlDriver } from './driver.ts';
import { TransactionRolledBack } from './errors.ts';
import { tightenDataDir } from '../config/data-dir-mode.ts';

export interface PgliteDriverOptions {
  /** Directory holding the database files; null keeps the database in memory (tests). */
  dataDir: string | null;
}

/**
 * Creates a new database directory in a short-lived child process. PGlite's initdb grows the
 * WebAssembly heap to ~800 MB, and a WebAssembly heap never shrinks: done in the server's own process,
 * that memory would stay resident for the server's whole life (opening an existing directory costs
 * ~150 MB).
 */
async function initDataDir(dir: string): Promise<void> {
  const pglite = pathToFileURL(createRequire(import.meta.url).resolve('@electric-sql/pglite')).href;
  const script = `const { PGlite } = await import(${JSON.stringify(pglite)}); const db = await PGlite.create(process.argv[1]); await db.close();`;
  await new Promise<void>((done, fail) => {
    const child = spawn(process.execPath, ['--input-type=module', '-e', script, dir], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr!.on('data', (d) => (stderr += d));
    child.once('error', fail);
    child.once('exit', (code) => (code === 0 ? done() : fail(new Error(`creating the embedded database in ${dir} failed (${code}): ${stderr.slice(-2000)}`))));
  });
}

/**
 * PGlite's Node file system, creating files and directories owner-only. Emscripten's FS sets a file's
 * mode itself once it has created it (a chmod to what postgres asks, 0666 in PGlite's build), so the
 * process umask does not reach the store's files; the mode of every create and chmod is masked here.
 */
type PostgresMod = postgresMod.PostgresMod;

class OwnerOnlyNodeFS extends NodeFS {
  override async init(pg: PGlite, opts: Partial<PostgresMod>): Promise<{ emscriptenOpts: Partial<PostgresMod> }> {
    const result = await super.init(pg, opts);
    const ownerOnly = (mod: PostgresMod) => {
      const fs = mod.FS as unknown as Record<'chmod' | 'mknod', (path: unknown, mode: number, ...rest: unknown[]) => unknown>;
      const { chmod, mknod } = fs;
      fs.chmod = (path, mode, ...rest) => chmod.call(fs, path, mode & ~0o077, ...rest);
      fs.mknod = (path, mode, ...rest) => mknod.call(fs, path, mode & ~0o077, ...rest);
    };
    const preRun = result.emscriptenOpts.preRun ?? [];
    return { emscriptenOpts: { ...result.emscriptenOpts, preRun: [ownerOnly, ...preRun] } };
  }
}

/** The driver, and its PGlite for the read-only SQL port (sql-port.ts), which serves snapshots of it. */
export interface PgliteDriver extends SqlDriver {
  readonly database: PGlite;
  /** The directory of its files; null in memory. */
  readonly directory: string | null;
}

export async function createPgliteDriver(options: PgliteDriverOptions): Promise<PgliteDriver> {
  let db: PGlite;
  const dir = options.dataDir === null ? null : join(resolve(options.dataDir), 'pglite');
  if (dir === null) db = await PGlite.create();
  else {
    if (!existsSync(join(dir, 'PG_VERSION'))) {
      await initDataDir(dir);
      tightenDataDir(dir); // initdb's child wrote its files with PGlite's own modes
    }
    db = await PGlite.create({ fs: new OwnerOnlyNodeFS(dir) });
  }
  // The store's SQL is written for READ COMMITTED (the append function re-reads after a unique violation).
  await db.exec(`SET default_transaction_isolation TO 'read committed'`);
  return {
    kind: 'pglite',
    database: db,
    directory: dir,
    // Every reader lives in this process and is woken directly; no NOTIFY needed.
    hint() {},
    // PGlite runs one statement at a time; batching still saves a statement per append.
    maxInFlight: 1,
    query: (sql, params) => db.query(sql, params as unknown[]) as never,
    // PGlite has no named statements; it is in this process, so there is no round trip to save.
    queryPrepared: (_name, sql, params) => db.query(sql, params) as never,
    transaction: (fn) =>
      db.transaction(async (tx) => {
        await tx.query('SET TRANSACTION ISOLATION LEVEL READ COMMITTED');
        const wrapped: DriverTransaction = {
          query: (sql, params) => tx.query(sql, params as unknown[]) as never,
          queryPrepared: (_name, sql, params) => tx.query(sql, params) as never,
          exec: async (sql) => {
            await tx.exec(sql);
          },
        };
        return fn(wrapped);
      }).catch((error: unknown) => {
        // A statement failed and the callback went on: PGlite's COMMIT rolled back; the same error as PostgreSQL's adapter.
        throw error instanceof TransactionAbortedError ? new TransactionRolledBack({ cause: error }) : error;
      }),
    async listen() {},
    close: () => db.close(),
  };
}
