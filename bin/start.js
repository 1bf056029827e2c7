#!/usr/bin/env node
// `npm start`: compiles the TypeScript into dist/ when a source is newer than the last build (build.js), then runs
// `svc serve --sql-port 0` from it in this very process. npm's script shell execs this process (`exec` in the start
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

// On the embedded store, `npm start` serves its read-only SQL port on loopback (any free port; `npm start --
// --sql-port N` for a fixed one, `--sql-port off` for none), so psql, `svc sql` and `svc audit` work while it runs.
const args = process.argv.slice(2);
const sqlPortGiven = args.some((arg) => arg === '--sql-port' || arg.startsWith('--sql-port='));
const sqlPort = process.env.DATABASE_URL || sqlPortGiven ? [] : ['--sql-port', '0'];
const main = join(root, 'dist', 'src', 'cli', 'main.js');
process.argv = [process.argv[0], main, 'serve', ...sqlPort, ...args];
await import(pathToFileURL(main).href);
