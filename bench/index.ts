// `npm run bench`: every benchmark script in its own process, one after another (they would skew each
// other side by side on 2 cores). `npm run bench -- gateway engine` runs only those. Set DATABASE_URL to
// include the PostgreSQL figures of the store and projection benchmarks.
import { spawnSync } from 'node:child_process';
import { root } from './support.ts';

const all = ['store', 'command-handler', 'metering', 'key-load', 'projections', 'completion-request', 'tokenizer', 'tokenize', 'engine', 'gateway', 'capture', 'backends', 'harvest', 'zstd', 'scale', 'paired', 'trace'];
const chosen = process.argv.slice(2).length > 0 ? process.argv.slice(2) : all;
const unknown = chosen.filter((name) => !all.includes(name));
if (unknown.length > 0) {
  process.stderr.write(`unknown benchmark(s): ${unknown.join(', ')}; choose from ${all.join(', ')}\n`);
  process.exit(2);
}

let failed = 0;
for (const name of chosen) {
  process.stdout.write(`\n=== bench/${name}.ts\n`);
  const result = spawnSync(process.execPath, ['--import', 'tsx', `bench/${name}.ts`], { cwd: root, stdio: 'inherit' });
  if (result.status !== 0) {
    failed++;
    process.stdout.write(`bench/${name}.ts exited with ${result.status ?? result.signal}\n`);
  }
}
process.exitCode = failed > 0 ? 1 : 0;
