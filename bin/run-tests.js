#!/usr/bin/env node
// Runs every test/**/*.test.ts file in its own Node process (uvu suites, tsx loader), two at a time,
// and prints one closing line "N passed, N failed, N skipped". Args filter files by substring.
import { spawn } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { availableParallelism } from 'node:os';

const root = fileURLToPath(new URL('..', import.meta.url));
const filters = process.argv.slice(2);

function findTests(dir) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return findTests(path);
    return name.endsWith('.test.ts') ? [path] : [];
  });
}

const files = findTests(join(root, 'test'))
  .map((f) => relative(root, f))
  .filter((f) => filters.length === 0 || filters.some((x) => f.includes(x)))
  .sort();

const totals = { passed: 0, failed: 0, skipped: 0 };
const failedFiles = [];

function runFile(file) {
  return new Promise((resolve) => {
    const started = Date.now();
    const child = spawn(process.execPath, ['--import', 'tsx', file], {
      cwd: root,
      env: { ...process.env, NO_COLOR: '1', FORCE_COLOR: '0' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (out += d));
    // A hung file fails alone instead of stalling the whole run.
    const limitMs = Number(process.env.TEST_FILE_TIMEOUT_MS ?? 300_000);
    const timer = setTimeout(() => {
      out += `\n[run-tests] killed after ${limitMs / 1000} s\n`;
      child.kill('SIGKILL');
    }, limitMs);
    child.on('close', (code) => {
      clearTimeout(timer);
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

const queue = [...files];
const workers = Array.from({ length: Math.min(Number(process.env.TEST_CONCURRENCY ?? 0) || Math.max(2, availableParallelism()), queue.length) }, async () => {
  while (queue.length > 0) await runFile(queue.shift());
});
await Promise.all(workers);

if (failedFiles.length > 0) process.stdout.write(`\nfailed files:\n${failedFiles.map((f) => `  ${f}`).join('\n')}\n`);
process.stdout.write(`\n${totals.passed} passed, ${totals.failed} failed, ${totals.skipped} skipped\n`);
process.exitCode = totals.failed > 0 || files.length === 0 ? 1 : 0;
