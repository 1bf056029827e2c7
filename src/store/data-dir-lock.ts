/**
 * One process owns an embedded store's data directory. The lock file is created atomically with its
 * content (written to a private file, then hard-linked into place: the link fails if a lock exists),
 * so no reader ever sees a half-written lock. A stale lock is taken over under a second exclusive
 * file, the takeover claim, after checking that the lock is still the stale one: of several openers
 * racing for a stale lock exactly one wins. Stale means: on this host, its process is gone; from
 * another host (containers sharing a volume, where a pid means nothing), its holder stopped
 * refreshing the file's modification time for a lease period.
 */
import { linkSync, mkdirSync, readFileSync, renameSync, statSync, unlinkSync, utimesSync, writeFileSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { join, resolve } from 'node:path';
import { DataDirLocked } from './errors.ts';

export interface DataDirLock {
  readonly path: string;
  /** Adds what the holder serves (its SQL port) to the lock file, for the CLI to find. */
  advertise(served: { sqlPort: number }): void;
  release(): void;
}

export interface DataDirLockOptions {
  /** Another host's lock is stale once not refreshed for this long (default 60 s; refreshed every quarter). */
  leaseMs?: number;
}

interface LockOwner {
  pid: number;
  host: string;
  purpose: string;
  since: string;
  token: string;
  /** The holder's read-only SQL port on loopback, when it serves one. */
  sqlPort?: number;
}

/** Who holds the data directory's lock (null: nobody, or a stale holder), and its SQL port if it serves one. */
export function readDataDirLock(dataDir: string): { pid: number; host: string; purpose: string; since: string; sqlPort: number | null } | null {
  const path = join(resolve(dataDir), 'store.lock');
  const owner = parse(readRaw(path) ?? '');
  if (!owner || isStale(path, owner, 60_000)) return null;
  return { pid: owner.pid, host: owner.host, purpose: owner.purpose, since: owner.since, sqlPort: typeof owner.sqlPort === 'number' ? owner.sqlPort : null };
}

/** A takeover claim left by an opener that died mid-takeover is removed after this long. */
const claimExpiryMs = 10_000;

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function readRaw(path: string): string | null {
  try {
    return readFileSync(path, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw error;
  }
}

function parse(raw: string): LockOwner | null {
  try {
    return JSON.parse(raw) as LockOwner;
  } catch {
    return null;
  }
}

function pause(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

/** Creates `path` holding `content`, atomically; false if it exists. */
function createExclusive(path: string, content: string): boolean {
  const draft = `${path}.${randomUUID()}.draft`;
  writeFileSync(draft, content, { mode: 0o600 });
  try {
    linkSync(draft, path);
    return true;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw error;
  } finally {
    unlinkSync(draft);
  }
}

function isStale(path: string, owner: LockOwner | null, leaseMs: number): boolean {
  // unreadable content cannot come from this code (it creates the file whole): an older version's or a damaged lock
  if (!owner || typeof owner.pid !== 'number') return true;
  if ((owner.host ?? hostname()) === hostname()) return !alive(owner.pid);
  try {
    return Date.now() - statSync(path).mtimeMs > leaseMs;
  } catch {
    return true;
  }
}

export function acquireDataDirLock(dataDir: string, purpose: string, options: DataDirLockOptions = {}): DataDirLock {
  const leaseMs = options.leaseMs ?? 60_000;
  const dir = resolve(dataDir);
  mkdirSync(dir, { recursive: true });
  const path = join(dir, 'store.lock');
  const claim = `${path}.takeover`;
  const me: LockOwner = { pid: process.pid, host: hostname(), purpose, since: new Date().toISOString(), token: randomUUID() };
  const content = JSON.stringify(me);

  /** Replaces the stale lock `staleRaw` by ours, unless another opener got there first. */
  const takeOver = (staleRaw: string): boolean => {
    if (!createExclusive(claim, content)) {
      try {
        if (Date.now() - statSync(claim).mtimeMs > claimExpiryMs) unlinkSync(claim);
      } catch {
        // gone meanwhile: the next attempt sees what its owner did
      }
      return false;
    }
    try {
      if (readRaw(path) !== staleRaw) return false; // someone took it over (or released it) meanwhile
      unlinkSync(path);
      return createExclusive(path, content);
    } finally {
      unlinkSync(claim);
    }
  };

  for (let attempt = 0; attempt < 200; attempt++) {
    if (createExclusive(path, content)) return hold(path, me, leaseMs);
    const raw = readRaw(path);
    if (raw === null) continue; // released meanwhile
    const owner = parse(raw);
    if (!isStale(path, owner, leaseMs)) {
      if (owner!.pid === process.pid && owner!.host === me.host) {
        throw new DataDirLocked(dir, process.pid, `the embedded store in ${dir} is already open in this process`);
      }
      throw new DataDirLocked(
        dir,
        owner!.pid,
        `the embedded store in ${dir} is in use by another process (pid ${owner!.pid}${owner!.host && owner!.host !== me.host ? ` on ${owner!.host}` : ''}, ${owner!.purpose}, since ${owner!.since}). ` +
          'Only one process may open it: stop that process first, or run the command against a PostgreSQL store (DATABASE_URL).',
      );
    }
    if (takeOver(raw)) return hold(path, me, leaseMs);
    pause(5); // another opener is taking it over: see what it did
  }
  throw new Error(`could not take the lock ${path}`);
}

/** Keeps the lock fresh for other hosts and releases it (only if still ours) at release or exit. */
function hold(path: string, me: LockOwner, leaseMs: number): DataDirLock {
  const ours = () => parse(readRaw(path) ?? '')?.token === me.token;
  const heartbeat = setInterval(() => {
    try {
      const now = new Date();
      if (ours()) utimesSync(path, now, now);
    } catch {
      // the directory went away; the store will fail on its own
    }
  }, Math.max(1000, leaseMs / 4));
  heartbeat.unref();
  let released = false;
  const release = () => {
    if (released) return;
    released = true;
    clearInterval(heartbeat);
    process.off('exit', release);
    if (ours()) unlinkSync(path);
  };
  process.on('exit', release);
  const advertise = (served: { sqlPort: number }) => {
    if (released || !ours()) return;
    // Replaced whole by a rename: a reader sees the old content or the new, never a half-written file.
    const draft = `${path}.${randomUUID()}.draft`;
    writeFileSync(draft, JSON.stringify({ ...me, ...served }), { mode: 0o600 });
    renameSync(draft, path);
  };
  return { path, advertise, release };
}
