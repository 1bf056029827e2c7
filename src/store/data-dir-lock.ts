/**
 * One process owns an embedded store's data directory. The lock is a file created exclusively and
 * holding the owner's pid; a lock whose owner is gone is taken over.
 */
import { closeSync, mkdirSync, openSync, readFileSync, rmSync, writeSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { DataDirLocked } from './errors.ts';

export interface DataDirLock {
  readonly path: string;
  release(): void;
}

interface LockOwner {
  pid: number;
  purpose: string;
  since: string;
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function readOwner(path: string): LockOwner | null {
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as LockOwner;
  } catch {
    return null;
  }
}

export function acquireDataDirLock(dataDir: string, purpose: string): DataDirLock {
  const dir = resolve(dataDir);
  mkdirSync(dir, { recursive: true });
  const path = join(dir, 'store.lock');
  for (let attempt = 0; attempt < 3; attempt++) {
    let fd: number;
    try {
      fd = openSync(path, 'wx', 0o600);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
      const owner = readOwner(path);
      if (owner && owner.pid !== process.pid && alive(owner.pid)) {
        throw new DataDirLocked(
          dir,
          owner.pid,
          `the embedded store in ${dir} is in use by another process (pid ${owner.pid}, ${owner.purpose}, since ${owner.since}). ` +
            'Only one process may open it: stop that process first, or run the command against a PostgreSQL store (DATABASE_URL).',
        );
      }
      if (owner?.pid === process.pid) {
        throw new DataDirLocked(dir, process.pid, `the embedded store in ${dir} is already open in this process`);
      }
      rmSync(path, { force: true }); // the owner died without releasing it
      continue;
    }
    writeSync(fd, JSON.stringify({ pid: process.pid, purpose, since: new Date().toISOString() } satisfies LockOwner));
    closeSync(fd);
    let released = false;
    const release = () => {
      if (released) return;
      released = true;
      process.off('exit', release);
      if (readOwner(path)?.pid === process.pid) rmSync(path, { force: true });
    };
    process.on('exit', release);
    return { path, release };
  }
  throw new Error(`could not take the lock ${path}`);
}
