/**
 * What `svc serve` checks before it starts anything (engines, store, listener): the data directory is
 * not held by another process and the ports are free. Each failure is one line saying what is wrong
 * and which setting to change, instead of a stack trace once the engines are already up.
 */
import { createServer } from 'node:net';
import { resolve } from 'node:path';
import type { Settings } from '../config/index.ts';
import { readDataDirLock } from '../store/data-dir-lock.ts';

/** The service cannot start as configured; `message` is one line for the operator. */
export class ServeBlocked extends Error {
  override name = 'ServeBlocked';
}

/** Why `port` on `host` cannot be listened on, or null when it can (a port of 0 always can). */
async function portProblem(port: number, host: string): Promise<NodeJS.ErrnoException | null> {
  if (port === 0) return null;
  const probe = createServer();
  return new Promise((done) => {
    probe.once('error', (err: NodeJS.ErrnoException) => done(err));
    probe.listen({ port, host, exclusive: true }, () => probe.close(() => done(null)));
  });
}

/** The one-line message for a listen failure on `port`, where `setting` is what the operator changes. */
export function portBlocked(err: NodeJS.ErrnoException, port: number, host: string, setting: string): ServeBlocked | null {
  if (err.code === 'EADDRINUSE') return new ServeBlocked(`port ${port} on ${host} is already in use (another svc serve?): stop what holds it, or set ${setting} to a free port`);
  if (err.code === 'EACCES') return new ServeBlocked(`port ${port} on ${host} needs privileges this process lacks: set ${setting} to a port above 1023`);
  if (err.code === 'EADDRNOTAVAIL' || err.code === 'ENOTFOUND') return new ServeBlocked(`cannot listen on ${host}: it is not an address of this machine; set HOST`);
  return null;
}

export async function checkServeCanStart(settings: Settings, sqlPort: number | null = null): Promise<void> {
  if (!settings.databaseUrl) {
    const holder = readDataDirLock(settings.dataDir);
    if (holder) {
      throw new ServeBlocked(
        `the data directory ${resolve(settings.dataDir)} is in use by another process (pid ${holder.pid}, ${holder.purpose}, since ${holder.since}): ` +
          'stop it, or set DATA_DIR to another directory',
      );
    }
  }
  const checks: [number, string, string][] = [[settings.port, settings.host, 'PORT']];
  if (sqlPort) checks.push([sqlPort, '127.0.0.1', '--sql-port']);
  for (const [port, host, setting] of checks) {
    const err = await portProblem(port, host);
    if (err) throw portBlocked(err, port, host, setting) ?? err;
  }
}
