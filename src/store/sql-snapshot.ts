/**
 * Where the embedded store's SQL port runs its clients' statements: a snapshot of the database in a
 * child process with its own PGlite, never the gateway's. A statement there cannot hold the gateway's
 * PGlite (PGlite ignores statement_timeout, and its queries block their thread until they end), nor
 * grow the gateway's memory.
 *
 * - A snapshot is a copy of the database files made while the gateway's PGlite is held (no statement
 *   runs, so the files are what a crash at that instant would leave; the copy recovers as PostgreSQL
 *   does after a crash): a file copy of the data directory (a copy-on-write clone where the file system
 *   has them), or for an in-memory store PGlite's dumpDataDir. The gateway waits only for the copy.
 * - Freshness: a statement reads a snapshot taken at most `maxAgeMs` before it starts (a new one is
 *   taken when it needs one, so none is taken while no one reads); an older snapshot whose database
 *   has not changed since (same WAL position) is kept. Snapshots are taken at most one a second.
 * - A statement (with its client's whole extended-protocol batch) that runs longer than
 *   `statementTimeoutMs` is ended by killing the process: 57014 to the client; the next statement
 *   gets a new process on a new snapshot.
 * - Memory: the process's WebAssembly memory cannot grow past `memoryBytes` (sql-snapshot-child.ts),
 *   so a statement that needs more ends in PostgreSQL's own out of memory (53200); its JavaScript heap
 *   is bounded too, and a process that dies anyway is reported as 53200 and replaced.
 * - The analysts' views (analyst-views.ts) are made in each snapshot, so the gateway's database is
 *   never written by the port.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { constants, readFileSync } from 'node:fs';
import { cp, mkdir, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import type { PGlite } from '@electric-sql/pglite';
import { refreshAnalystViews } from './analyst-views.ts';
import { snapshotChildSource } from './sql-snapshot-child.ts';

export interface SnapshotOptions {
  /** A statement runs at most this long (ms). */
  statementTimeoutMs: number;
  /** The snapshot process's WebAssembly memory grows to at most this many bytes. */
  memoryBytes: number;
  /** A statement reads a snapshot at most this old (ms). */
  maxAgeMs: number;
}

/** An error the port sends its client as an ErrorResponse. */
export class SqlPortError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/** The gateway's PGlite, and the directory of its files (null: in memory). */
export interface SnapshotSource {
  database: PGlite;
  directory: string | null;
}

const minIntervalMs = 1_000;
const startTimeoutMs = 120_000;
const jsHeapMb = 128;

/** What the snapshot process holds besides its database memory: PGlite's code, Node, its JavaScript heap. */
const processOverheadBytes = 384 * 1024 * 1024;

/** A process's resident memory (Linux /proc), or null where it cannot be read. */
function residentBytes(pid: number | undefined): number | null {
  try {
    const kb = /VmRSS:\s*(\d+)\s*kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
    return kb ? Number(kb[1]) * 1024 : null;
  } catch {
    return null;
  }
}

function simpleQuery(sql: string): Buffer {
  const body = Buffer.from(`${sql}\0`, 'utf8');
  const head = Buffer.alloc(5);
  head.write('Q', 0, 'latin1');
  head.writeInt32BE(body.length + 4, 1);
  return Buffer.concat([head, body]);
}

/** The first column of the first row of a raw reply, as text. */
function firstValue(reply: Buffer): string | null {
  for (let at = 0; at + 5 <= reply.length; at += 1 + reply.readInt32BE(at + 1)) {
    if (reply[at] === 0x44 && reply.readInt16BE(at + 5) > 0) {
      const length = reply.readInt32BE(at + 7);
      return length < 0 ? null : reply.toString('utf8', at + 11, at + 11 + length);
    }
  }
  return null;
}

/** Runs `fn` with the gateway's PGlite held: no query or transaction of the gateway runs meanwhile. */
const holding = <T>(db: PGlite, fn: () => Promise<T>) => db._runExclusiveTransaction(() => db._runExclusiveQuery(fn));

async function walPosition(db: PGlite): Promise<string> {
  const out: Buffer[] = [];
  await db.execProtocolRawStream(simpleQuery('SELECT pg_current_wal_lsn()::text'), { onRawData: (d) => out.push(Buffer.from(d)), syncToFs: false });
  return firstValue(Buffer.concat(out)) ?? '';
}

interface Child {
  process: ChildProcess;
  stderr: string;
  /** Where its snapshot is (removed with it). */
  path: string;
  takenAt: number;
  lsn: string;
  /** The request under way: told of each message, and of the process's end. */
  listener: ((message: ChildMessage) => void) | null;
  exited: Promise<void>;
}

type ChildMessage = { type: 'ready' } | { type: 'data'; chunk: Uint8Array } | { type: 'done'; rows?: Record<string, unknown>[] } | { type: 'failed'; message: string; code: string | null } | { type: 'exit' };

export interface SnapshotReader {
  /** Runs `messages` in the transaction `open` opens, on a snapshot at most maxAgeMs old; the raw reply goes to onData. */
  read(request: { open: string; messages: Buffer[]; onData: (chunk: Buffer) => void }): Promise<void>;
  close(): Promise<void>;
}

export function openSnapshotReader(source: SnapshotSource, snapshotsDir: string, options: SnapshotOptions): SnapshotReader {
  const require = createRequire(import.meta.url);
  const pgliteUrl = pathToFileURL(require.resolve('@electric-sql/pglite')).href;
  const nodefsUrl = pathToFileURL(require.resolve('@electric-sql/pglite/nodefs')).href;
  let current: Child | null = null;
  let lastTake = 0;
  let serial = 0;
  let closed = false;
  /** Requests run one at a time: the snapshot's PGlite has one session. */
  let queue: Promise<unknown> = rm(snapshotsDir, { recursive: true, force: true }).then(() => mkdir(snapshotsDir, { recursive: true, mode: 0o700 }));

  const retire = async (child: Child) => {
    if (current === child) current = null;
    child.process.kill('SIGKILL');
    await child.exited;
    await rm(child.path, { recursive: true, force: true });
  };

  /**
   * Sends one request; resolves with its `done`, or rejects (and kills the process) on failure,
   * timeout, exit, or the process's resident memory past its bound (what the WebAssembly bound does
   * not cover: replies queued for the gateway, JavaScript buffers), watched where /proc tells it.
   */
  const ask = (child: Child, request: object, timeoutMs: number, onData?: (chunk: Buffer) => void) =>
    new Promise<Record<string, unknown>[] | undefined>((resolve, reject) => {
      const fail = (error: SqlPortError) => {
        clearTimeout(timer);
        clearInterval(watch);
        child.listener = null;
        reject(error);
        void retire(child);
      };
      const timer = setTimeout(
        () => fail(new SqlPortError('57014', `canceling statement due to statement timeout: the SQL port ends a statement after ${timeoutMs} ms (SVC_SQL_STATEMENT_TIMEOUT_MS)`)),
        timeoutMs,
      );
      const watch = setInterval(() => {
        const rss = residentBytes(child.process.pid);
        if (rss !== null && rss > options.memoryBytes + processOverheadBytes) fail(new SqlPortError('53200', `out of memory: the SQL port's process passed its bound (SVC_SQL_MEMORY_MB, ${Math.round(options.memoryBytes / 1048576)} MiB, plus its own code)`));
      }, 250);
      child.listener = (message) => {
        if (message.type === 'data') return onData?.(Buffer.from(message.chunk));
        if (message.type === 'exit') {
          // The process died under the statement: its memory ran out (JavaScript heap; the WebAssembly heap fails inside PostgreSQL instead).
          const heap = /out of memory|heap limit/i.test(child.stderr);
          return fail(new SqlPortError('53200', `out of memory: the SQL port's process ended under the statement (its memory is bounded, SVC_SQL_MEMORY_MB)${heap ? '' : `: ${child.stderr.slice(-300).trim()}`}`));
        }
        clearTimeout(timer);
        clearInterval(watch);
        child.listener = null;
        if (message.type === 'done') resolve(message.rows);
        else if (message.type === 'failed') reject(new SqlPortError(message.code ?? 'XX000', message.message));
        else reject(new SqlPortError('XX000', `the SQL port's process answered ${message.type}`));
      };
      child.process.send(request);
    });

  /** A new snapshot and its process. */
  async function take(): Promise<Child> {
    const wait = lastTake + minIntervalMs - Date.now();
    if (wait > 0) await new Promise((r) => setTimeout(r, wait));
    lastTake = Date.now();
    const path = join(snapshotsDir, String(++serial));
    const db = source.database;
    const takenAt = Date.now();
    let lsn = '';
    if (source.directory !== null) {
      const from = source.directory;
      await holding(db, async () => {
        lsn = await walPosition(db);
        await cp(from, path, { recursive: true, mode: constants.COPYFILE_FICLONE });
      });
    } else {
      // dumpDataDir holds PGlite's query lock itself; the transaction lock keeps the gateway's transactions out between the two.
      const tar = await db._runExclusiveTransaction(async () => {
        lsn = await db._runExclusiveQuery(() => walPosition(db));
        return db.dumpDataDir('none');
      });
      await writeFile(path, Buffer.from(await tar.arrayBuffer()), { mode: 0o600 });
    }
    const processed = spawn(
      process.execPath,
      [`--max-old-space-size=${jsHeapMb}`, '--input-type=module', '-e', snapshotChildSource, pgliteUrl, nodefsUrl, source.directory !== null ? 'dir' : 'tar', path, String(options.memoryBytes)],
      { stdio: ['ignore', 'ignore', 'pipe', 'ipc'], serialization: 'advanced' },
    );
    let exitedResolve!: () => void;
    const child: Child = { process: processed, stderr: '', path, takenAt, lsn, listener: null, exited: new Promise((r) => (exitedResolve = r)) };
    processed.stderr!.on('data', (d) => (child.stderr = (child.stderr + d).slice(-4000)));
    processed.on('message', (m: ChildMessage) => child.listener?.(m));
    processed.once('exit', () => {
      exitedResolve();
      child.listener?.({ type: 'exit' });
    });
    processed.once('error', () => child.listener?.({ type: 'exit' }));
    try {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(() => reject(new SqlPortError('XX000', 'the SQL port\'s process did not start')), startTimeoutMs);
        child.listener = (m) => {
          clearTimeout(timer);
          child.listener = null;
          if (m.type === 'ready') resolve();
          else reject(new SqlPortError('XX000', `the SQL port's process did not start: ${child.stderr.slice(-500).trim()}`));
        };
      });
      // The views analysts read, over this snapshot's tables.
      await refreshAnalystViews({
        query: async (sql, params) => ({ rows: ((await ask(child, { op: 'query', sql, params }, startTimeoutMs)) ?? []) as never }),
        exec: async (sql) => void (await ask(child, { op: 'exec', sql }, startTimeoutMs)),
      });
    } catch (error) {
      await retire(child);
      throw error;
    }
    return child;
  }

  /** The process to run a statement on: its snapshot taken no earlier than `notBefore`. */
  async function fresh(notBefore: number): Promise<Child> {
    if (current && current.takenAt < notBefore) {
      const at = Date.now();
      const db = source.database;
      const lsn = await holding(db, () => walPosition(db));
      if (lsn === current.lsn) current.takenAt = at;
      else await retire(current);
    }
    if (!current) current = await take();
    return current;
  }

  return {
    read(request) {
      const run = queue.then(async () => {
        if (closed) throw new SqlPortError('57P01', 'the SQL port is closing');
        const child = await fresh(Date.now() - options.maxAgeMs);
        await ask(child, { op: 'read', open: request.open, messages: request.messages }, options.statementTimeoutMs, request.onData);
      });
      queue = run.catch(() => {});
      return run;
    },
    async close() {
      closed = true;
      if (current) await retire(current);
      await queue;
      if (current) await retire(current);
      await rm(snapshotsDir, { recursive: true, force: true });
    },
  };
}
