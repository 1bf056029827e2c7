#!/usr/bin/env node
// `npm start`: compiles the TypeScript into dist/ when a source is newer than the last build, then runs
// `svc serve` from it in this very process. npm's script shell execs this process (`exec` in the start
// script), so the SIGTERM or SIGINT npm forwards, or a terminal's SIGINT/SIGHUP, reaches the gateway
// itself, which drains and stops its engines; nothing is left behind holding the port or the data directory.
import { spawn } from 'node:child_process';
import { readdirSync, statSync, utimesSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = fileURLToPath(new URL('..', import.meta.url));
const stamp = join(root, 'dist', '.built');
const sources = ['src', 'events', 'commands', 'projections'];

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

const newest = Math.max(...sources.map((dir) => newestSource(join(root, dir))), ...['tsconfig.json', 'tsconfig.build.json', 'package-lock.json'].map((f) => statSync(join(root, f)).mtimeMs));
if (newest > builtAt()) {
  const startedAt = new Date();
  process.stderr.write('svc: compiling the TypeScript (npm run build)...\n');
  const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
  const build = spawn(process.execPath, [tsc, '-p', join(root, 'tsconfig.build.json')], { cwd: root, stdio: 'inherit' });
  // A stop while compiling stops the compiler too.
  const stop = (signal) => build.kill(signal);
  const signals = ['SIGTERM', 'SIGINT', 'SIGHUP'];
  for (const signal of signals) process.on(signal, stop);
  const [code, signal] = await new Promise((resolve) => build.once('exit', (c, s) => resolve([c, s])));
  for (const s of signals) process.off(s, stop);
  if (code !== 0) {
    process.stderr.write(`svc: the build ${signal ? `was stopped (${signal})` : `failed (exit ${code})`}\n`);
    process.exit(signal ? 1 : code);
  }
  // Sources saved during the build are newer than the stamp: the next start builds again.
  writeFileSync(stamp, `${startedAt.toISOString()}\n`);
  utimesSync(stamp, startedAt, startedAt);
}

// A supervisor that kills npm outright (SIGKILL) leaves this process re-parented: stop as if told to.
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) process.kill(process.pid, 'SIGTERM');
}, 1000).unref();

const main = join(root, 'dist', 'src', 'cli', 'main.js');
process.argv = [process.argv[0], main, 'serve', ...process.argv.slice(2)];
await import(pathToFileURL(main).href);
