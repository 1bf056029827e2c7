#!/usr/bin/env node
// `npm start`: compiles the TypeScript into dist/ when a source is newer than the last build (build.js), then runs
// `svc serve` from it in this very process. npm's script shell execs this process (`exec` in the start
// script), so the SIGTERM or SIGINT npm forwards, or a terminal's SIGINT/SIGHUP, reaches the gateway
// itself, which drains and stops its engines; nothing is left behind holding the port or the data directory.
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { ensureBuilt, root } from './build.js';

if (!(await ensureBuilt())) process.exit(1);

// A supervisor that kills npm outright (SIGKILL) leaves this process re-parented: stop as if told to.
const parent = process.ppid;
setInterval(() => {
  if (process.ppid !== parent) process.kill(process.pid, 'SIGTERM');
}, 1000).unref();

const main = join(root, 'dist', 'src', 'cli', 'main.js');
process.argv = [process.argv[0], main, 'serve', ...process.argv.slice(2)];
await import(pathToFileURL(main).href);
