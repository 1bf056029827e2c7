#!/usr/bin/env node
// The build of the TypeScript into dist/ (tsc -p tsconfig.build.json), made only when a source is
// newer than the last one. `npm ci` runs it (the package's prepare script), `npm start` checks it
// before serving, and `svc` runs from dist/ whenever it is current (from the sources through tsx
// otherwise), so a command starts in well under a second.
import { spawn } from 'node:child_process';
import { readdirSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const root = fileURLToPath(new URL('..', import.meta.url));
const stamp = join(root, 'dist', '.built');
const sources = ['src', 'events', 'deciders', 'workflows', 'projections'];

function newestSource(path) {
  const stat = statSync(path);
  if (!stat.isDirectory()) return path.endsWith('.ts') || path.endsWith('.json') ? stat.mtimeMs : 0;
  return Math.max(0, ...readdirSync(path).map((name) => newestSource(join(path, name))));
}

function builtAt() {
  try {
    return statSync(stamp).mtimeMs;
  } catch {
    return -1;
  }
}

/** dist/ holds a build of the sources as they are now. */
export function isBuilt() {
  const newest = Math.max(...sources.map((dir) => newestSource(join(root, dir))), ...['tsconfig.json', 'tsconfig.build.json', 'package-lock.json'].map((f) => statSync(join(root, f)).mtimeMs));
  return newest <= builtAt();
}

/**
 * Builds when dist/ is not current, saying so on stderr with the seconds passing (a first build takes
 * about a minute on two busy cores). Resolves true once dist/ is current; false if the build failed or
 * was stopped (a SIGTERM, SIGINT or SIGHUP meanwhile stops the compiler too).
 */
export async function ensureBuilt() {
  if (isBuilt()) return true;
  const startedAt = new Date();
  const tty = process.stderr.isTTY;
  process.stderr.write(`svc: compiling the TypeScript into dist/ (npm run build), once after each change to the sources${tty ? '' : '...\n'}`);
  const ticker = tty ? setInterval(() => process.stderr.write(`\rsvc: compiling the TypeScript into dist/ (npm run build): ${Math.round((Date.now() - startedAt.getTime()) / 1000)} s`), 1000) : null;
  const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  const build = spawn(process.execPath, [tsc, '-p', join(root, 'tsconfig.build.json')], { cwd: root, stdio: 'inherit' });
  const stop = (signal) => build.kill(signal);
  const signals = ['SIGTERM', 'SIGINT', 'SIGHUP'];
  for (const signal of signals) process.on(signal, stop);
  const [code, signal] = await new Promise((resolve) => build.once('exit', (c, s) => resolve([c, s])));
  for (const s of signals) process.off(s, stop);
  if (ticker) clearInterval(ticker);
  if (tty) process.stderr.write('\n');
  if (code !== 0) {
    process.stderr.write(`svc: the build ${signal ? `was stopped (${signal})` : `failed (exit ${code})`}\n`);
    return false;
  }
  // Sources saved during the build are newer than the stamp: the next check builds again.
  writeFileSync(stamp, `${startedAt.toISOString()}\n`);
  utimesSync(stamp, startedAt, startedAt);
  process.stderr.write(`svc: compiled in ${Math.round((Date.now() - startedAt.getTime()) / 1000)} s\n`);
  return true;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) process.exitCode = (await ensureBuilt()) ? 0 : 1;
