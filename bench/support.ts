import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

export const root = fileURLToPath(new URL('..', import.meta.url));

const children = new Set<ChildProcess>();
// A benchmark that fails half-way must not leave its gateway or engine running.
process.once('exit', () => {
  for (const child of children) if (child.exitCode === null) child.kill('SIGKILL');
});

/** Spawns a process and resolves with the first JSON line on stdout that carries a URL (or a regex match on stderr). */
export async function spawnWithUrl(args: string[], env: NodeJS.ProcessEnv, stderrPattern?: RegExp): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, args, { cwd: root, env, stdio: ['ignore', 'pipe', 'pipe'] });
  children.add(child);
  child.once('exit', () => children.delete(child));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no URL from ${args.join(' ')} in 60 s`)), 60_000);
    createInterface({ input: child.stdout! }).on('line', (line) => {
      try {
        const parsed = JSON.parse(line);
        if (parsed.url && parsed.event === 'listening') {
          clearTimeout(timer);
          resolve(parsed.url);
        }
      } catch {
        /* log lines */
      }
    });
    let err = '';
    child.stderr!.on('data', (d) => {
      err += d;
      const m = stderrPattern && err.match(stderrPattern);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    child.once('exit', (code) => reject(new Error(`${args.join(' ')} exited ${code}: ${err.slice(-2000)}`)));
  });
  return { child, url };
}

/** Peak resident set (VmHWM) and current RSS of a process, in MB. */
export function memoryOf(pid: number): { rssMb: number; peakMb: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (field: string) => Number(status.match(new RegExp(`${field}:\\s+(\\d+)`))?.[1] ?? 0);
  return { rssMb: kb('VmRSS') / 1024, peakMb: kb('VmHWM') / 1024 };
}

export function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

export function stop(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null) return resolve();
    child.once('exit', () => resolve());
    child.kill('SIGTERM');
    setTimeout(() => child.kill('SIGKILL'), 10_000).unref();
  });
}
