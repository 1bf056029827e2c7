#!/usr/bin/env node
// Runs every test/**/*.test.ts file in its own Node process (uvu suites, tsx loader), several at a time
// (TEST_CONCURRENCY, default: one more than the cores), longest first, and prints one closing line
// "N passed, N failed, N skipped". Args filter files by substring. Stopping it (SIGINT, SIGTERM,
// SIGHUP) stops every file it started and everything those started.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readdirSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { availableParallelism, tmpdir } from 'node:os';

const root = fileURLToPath(new URL('..', import.meta.url));
const filters = process.argv.slice(2);

function findTests(dir) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return findTests(path);
    return name.endsWith('.test.ts') ? [path] : [];
  });
}

// Each file's last duration, kept outside the checkout: the longest files start first, so the run does not end
// waiting on one slow file started late. A file never timed here starts first, in name order (a fresh machine
// runs everything in name order).
const durationsPath = join(tmpdir(), `svc-test-durations-${createHash('sha256').update(root).digest('hex').slice(0, 12)}.json`);
let durations = {};
try {
  durations = JSON.parse(readFileSync(durationsPath, 'utf8'));
} catch {
  // first run on this machine
}
// TEST_DIR: another folder of test files (the runner's own test runs it on files it makes).
const allFiles = findTests(process.env.TEST_DIR ?? join(root, 'test')).map((f) => relative(root, f));
const files = allFiles
  .filter((f) => filters.length === 0 || filters.some((x) => f.includes(x)))
  .sort()
  .sort((a, b) => (durations[b] ?? Infinity) - (durations[a] ?? Infinity));

const totals = { passed: 0, failed: 0, skipped: 0 };

const queue = [...files];
/** The files running now. */
const running = new Set();
function killGroup(child, signal) {
  try {
    process.kill(-child.pid, signal);
  } catch {
    // already gone
  }
}
// SIGINT, SIGTERM or SIGHUP to the runner (or to npm, which passes it on) stops every file's process
// group, its gateways and engines included: SIGTERM first, SIGKILL to what is left after 5 s.
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.once(signal, () => {
    process.stdout.write(`\n[run-tests] ${signal}: stopping ${running.size} running test file(s)\n`);
    queue.length = 0;
    for (const child of running) killGroup(child, 'SIGTERM');
    setTimeout(() => {
      for (const child of running) killGroup(child, 'SIGKILL');
      process.exit(130);
    }, 5_000).unref();
    if (running.size === 0) process.exit(130);
  });
}
const failedFiles = [];

function runFile(file) {
  return new Promise((resolve) => {
    const started = Date.now();
    // Each file in a process group of its own: stopping the runner stops the file and whatever it started.
    const child = spawn(process.execPath, ['--import', 'tsx', file], {
      cwd: root,
      env: { ...process.env, NO_COLOR: '1', FORCE_COLOR: '0' },
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true,
    });
    running.add(child);
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    // A hung file fails alone instead of stalling the whole run.
    // Generous: a busy machine runs a file several times slower than a quiet one.
    const limitMs = Number(process.env.TEST_FILE_TIMEOUT_MS ?? 600_000);
    const timer = setTimeout(() => {
      out += `\n[run-tests] killed after ${limitMs / 1000} s\n`;
      killGroup(child, 'SIGKILL');
    }, limitMs);
    child.on('close', (code) => {
      clearTimeout(timer);
      running.delete(child);
      const clean = out.replace(/\x1b\[[0-9;]*m/g, '');
      const num = (label) => Number((clean.match(new RegExp(`${label}:\\s+(\\d+)`)) ?? [])[1] ?? 0);
      const total = num('Total');
      const passed = num('Passed');
      const skipped = num('Skipped');
      // uvu counts skipped tests apart from its Total (a skipped test never runs): Total - Passed failed.
      let failed = Math.max(0, total - passed);
      if (code !== 0 && failed <= 0) failed = 1; // a crash before or after the suites still fails the file
      totals.passed += passed;
      totals.failed += failed;
      totals.skipped += skipped;
      const secs = ((Date.now() - started) / 1000).toFixed(1);
      durations[file] = Number(secs);
      const verdict = failed > 0 ? 'FAIL' : 'ok  ';
      process.stdout.write(`${verdict} ${file} (${passed} passed, ${skipped} skipped, ${secs}s)\n`);
      if (failed > 0) {
        failedFiles.push(file);
        process.stdout.write(clean.split('\n').map((l) => `    ${l}`).join('\n') + '\n');
      }
      resolve();
    });
  });
}

// Most files spend much of their time waiting on child processes, sockets and timers: one more file than cores keeps them busy.
const concurrency = Number(process.env.TEST_CONCURRENCY ?? 0) || availableParallelism() + 1;
const workers = Array.from({ length: Math.min(concurrency, queue.length) }, async () => {
  while (queue.length > 0) await runFile(queue.shift());
});
await Promise.all(workers);
try {
  writeFileSync(`${durationsPath}.${process.pid}`, JSON.stringify(Object.fromEntries(allFiles.filter((f) => f in durations).map((f) => [f, durations[f]]))));
  renameSync(`${durationsPath}.${process.pid}`, durationsPath);
} catch {
  // the order is only an optimisation
}

if (failedFiles.length > 0) process.stdout.write(`\nfailed files:\n${failedFiles.map((f) => `  ${f}`).join('\n')}\n`);
process.stdout.write(`\n${totals.passed} passed, ${totals.failed} failed, ${totals.skipped} skipped\n`);
process.exitCode = totals.failed > 0 || files.length === 0 ? 1 : 0;
