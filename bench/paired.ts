// Paired throughput: several builds or settings of the gateway side by side, their load runs alternated
// (A B C, C B A, ...) so that the machine's drift hits them alike. On this 2-core VM the same gateway's
// CPU per request moves by ±20 % from one 8 s run to the next, and a whole-bench run compares one run
// of each, so a change of 10 % needs this. Each variant is a gateway process on a PostgreSQL database
// of its own (DATABASE_URL, required), in front of the instant engine stub, 64 connections over 384 keys.
// Prints, per variant, each run's gateway CPU µs per request (all threads; the main thread's median
// beside it: what bounds throughput where cores are to spare) and requests/s, their medians, and the
// main thread's scavenge (minor GC) time per request (a PerformanceObserver loaded into the gateway).
//
// Variants (BENCH_VARIANTS, a comma-separated list; default `metered,metered-semi16,unmetered`):
// - `metered`, `unmetered`, `noproj`: this checkout as `npm start` runs it (metering on, off, or on
//   without projections in the process);
// - `metered-semi16`: metered with Node's default young generation (16 MB semi-spaces), for the
//   setting `npm start` changes (src/README.md);
// - `ref:<git ref>`: that commit, metered, built into a scratch worktree, with the flags of its own
//   start script (`ref:HEAD~3`, say: what a change did, measured beside it).
// BENCH_ROUNDS (default 4) alternations of BENCH_SECONDS (default 8) s each, after a 10 s warm-up each.
// BENCH_PAIRED=latency measures sequential latency instead: one request at a time to each variant in
// turn (A B, B A, ...), BENCH_REQUESTS (default 3,000) each after 1,000 each of warm-up, and prints each
// variant's p50, p90 and p99 as the client saw them. Two runs of one build differ by ±20 % on this VM;
// requests alternated one by one see the same moment of it, so a change of 0.05 ms shows.
// BENCH_ENGINE_DELAY_MS (default 0): the engine stub waits that long before each answer (20: the
// gateway bench's 20 ms engine, where metering's append overlaps the engine call).
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir, cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { KeyPool, benchCompletionBody, buildGateway, cpuPerRequest, cpuSecondsOf, gatewayEnv, gatewayServeArgs, issueKeys, median, percentile, postLoad, root, scratchDatabase, spawnWithUrl, startInstantEngine, startScriptFlags, stop } from './support.ts';

if (!process.env.DATABASE_URL) {
  process.stdout.write('paired: skipped, it needs DATABASE_URL (a PostgreSQL database to create scratch databases beside)\n');
  process.exit(0);
}
const variants = (process.env.BENCH_VARIANTS ?? 'metered,metered-semi16,unmetered').split(',');
const rounds = Number(process.env.BENCH_ROUNDS ?? 4);
const seconds = Number(process.env.BENCH_SECONDS ?? 8);
const startedAt = new Date();
const dir = mkdtempSync(join(tmpdir(), 'svc-bench-paired-'));
const cleanups: (() => Promise<void> | void)[] = [() => rmSync(dir, { recursive: true, force: true })];
const gcObserver = join(dir, 'gc-observer.mjs');
// Loaded into each gateway (--import): the main thread's minor GC time, written where the bench reads it.
writeFileSync(
  gcObserver,
  `import { PerformanceObserver, constants } from 'node:perf_hooks';
   import { writeFileSync } from 'node:fs';
   let minorMs = 0;
   new PerformanceObserver((list) => { for (const e of list.getEntries()) if (e.detail?.kind === constants.NODE_PERFORMANCE_GC_MINOR) minorMs += e.duration; }).observe({ entryTypes: ['gc'] });
   setInterval(() => writeFileSync(${JSON.stringify(dir)} + '/gc-' + process.pid, String(minorMs)), 250).unref();\n`,
);
const minorGcMs = (pid: number) => (existsSync(join(dir, `gc-${pid}`)) ? Number(readFileSync(join(dir, `gc-${pid}`), 'utf8')) : NaN);

/** The gateway's command line for a variant: this checkout's start flags, or another commit's build. */
function commandFor(variant: string): { args: string[]; metering: string; projections: string } {
  const here = gatewayServeArgs(['--import', gcObserver]);
  if (variant === 'metered') return { args: here, metering: 'on', projections: 'on' };
  if (variant === 'unmetered') return { args: here, metering: 'off', projections: 'on' };
  if (variant === 'noproj') return { args: here, metering: 'on', projections: 'off' };
  if (variant === 'metered-semi16') return { args: here.filter((a) => !a.startsWith('--max-semi-space-size')), metering: 'on', projections: 'on' };
  if (variant.startsWith('ref:')) {
    const ref = variant.slice(4);
    const tree = join(dir, `tree-${ref.replace(/[^A-Za-z0-9]/g, '_')}`);
    execFileSync('git', ['worktree', 'add', '--detach', '-q', tree, ref], { cwd: root });
    cleanups.push(() => void execFileSync('git', ['worktree', 'remove', '--force', tree], { cwd: root }));
    symlinkSync(join(root, 'node_modules'), join(tree, 'node_modules'));
    buildGateway(tree);
    return { args: ['--import', gcObserver, ...startScriptFlags(tree), join(tree, 'bin/start.js')], metering: 'on', projections: 'on' };
  }
  throw new Error(`unknown variant ${variant}: metered, unmetered, noproj, metered-semi16 or ref:<git ref>`);
}

const engineDelayMs = Number(process.env.BENCH_ENGINE_DELAY_MS ?? 0) || 0;
const engineName = engineDelayMs > 0 ? `engine taking ${engineDelayMs} ms` : 'instant engine';

try {
  buildGateway();
  const engine = await startInstantEngine(dir, engineDelayMs);
  cleanups.push(() => stop(engine.child));
  const body = benchCompletionBody;
  const gateways: Gateway[] = [];
  for (const [i, variant] of variants.entries()) {
    const command = commandFor(variant);
    const db = await scratchDatabase(process.env.DATABASE_URL, `paired_${i}`);
    cleanups.push(db.drop);
    const env = gatewayEnv(dir, `data-${i}`, { SVC_METERING: command.metering, SVC_PROJECTIONS: command.projections, DATABASE_URL: db.url });
    const gw = await spawnWithUrl(command.args, env, /listening on (http:\/\/\S+)/);
    cleanups.push(() => stop(gw.child));
    const pool = new KeyPool(await issueKeys(gw.url, 384, `paired-${i}`));
    await postLoad({ url: `${gw.url}/v1/completions`, body, connections: 64, seconds: 10, authorization: () => pool.next() });
    gateways.push({ variant, url: gw.url, pid: gw.child.pid!, pool, cpu: [] as number[], mainCpu: [] as number[], rps: [] as number[], gc: [] as number[] });
  }
  if (process.env.BENCH_PAIRED === 'latency') await latency(gateways, body);
  else await throughput(gateways, body);
} finally {
  for (const fn of cleanups.reverse()) await Promise.resolve(fn()).catch((err) => process.stderr.write(`cleanup: ${err}\n`));
}

type Gateway = { variant: string; url: string; pid: number; pool: KeyPool; cpu: number[]; mainCpu: number[]; rps: number[]; gc: number[] };

/** Sequential requests, alternated one by one across the variants (BENCH_PAIRED=latency). */
async function latency(gateways: Gateway[], body: string): Promise<void> {
  const requests = Number(process.env.BENCH_REQUESTS ?? 3000);
  const clients = gateways.map(() => new Agent({ connections: 1 }));
  cleanups.push(() => Promise.all(clients.map((c) => c.close())).then(() => {}));
  const times = gateways.map(() => [] as number[]);
  for (let i = 0; i < requests + 1000; i++) {
    for (const g of i % 2 === 0 ? gateways.keys() : [...gateways.keys()].reverse()) {
      const started = performance.now();
      const response = await request(`${gateways[g].url}/v1/completions`, { method: 'POST', dispatcher: clients[g], headers: { 'content-type': 'application/json', authorization: gateways[g].pool.next() }, body });
      await response.body.arrayBuffer();
      if (response.statusCode !== 200) throw new Error(`${gateways[g].variant}: status ${response.statusCode}`);
      if (i >= 1000) times[g].push(performance.now() - started);
    }
  }
  const ms = (sorted: number[], p: number) => percentile(sorted, p).toFixed(3);
  const lines = [
    `paired sequential latency, ${requests} requests each alternated one by one, ${engineName}, PostgreSQL — ${startedAt.toISOString()} to ${new Date().toISOString()} — ${cpus().length} cores (${cpus()[0]?.model}), Node ${process.version}, load average ${loadavg()[0].toFixed(1)} at end`,
    ...gateways.map((g, i) => {
      const sorted = times[i].sort((a, b) => a - b);
      return `${g.variant.padEnd(16)} p50 ${ms(sorted, 50)} ms | p90 ${ms(sorted, 90)} ms | p99 ${ms(sorted, 99)} ms`;
    }),
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
}

/** BENCH_ROUNDS alternated load runs of BENCH_SECONDS each at 64 connections. */
async function throughput(gateways: Gateway[], body: string): Promise<void> {
  for (let r = 0; r < rounds; r++) {
    for (const g of r % 2 === 0 ? gateways : [...gateways].reverse()) {
      await new Promise((resolve) => setTimeout(resolve, 300)); // the observer's last figure is written
      const gcBefore = minorGcMs(g.pid);
      const meter = cpuPerRequest({ gateway: g.pid });
      const mainBefore = cpuSecondsOf(g.pid, 'main');
      const result = await postLoad({ url: `${g.url}/v1/completions`, body, connections: 64, seconds, authorization: () => g.pool.next() });
      const cpu = meter.stop(result.requests.total);
      g.mainCpu.push(((cpuSecondsOf(g.pid, 'main') - mainBefore) * 1e6) / result.requests.total);
      await new Promise((resolve) => setTimeout(resolve, 300));
      g.cpu.push(cpu.gateway);
      g.rps.push(result.requests.average);
      g.gc.push(((minorGcMs(g.pid) - gcBefore) * 1000) / result.requests.total);
    }
  }
  const lines = [
    `paired gateway throughput, ${rounds} alternated runs of ${seconds} s at 64 connections, ${engineName}, PostgreSQL — ${startedAt.toISOString()} to ${new Date().toISOString()} — ${cpus().length} cores (${cpus()[0]?.model}), Node ${process.version}, load average ${loadavg()[0].toFixed(1)} at end`,
    ...gateways.map((g) => `${g.variant.padEnd(16)} gateway CPU µs/request ${g.cpu.map(Math.round).join(', ')} (median ${Math.round(median(g.cpu))}) (main thread ${Math.round(median(g.mainCpu))}) | requests/s ${g.rps.map(Math.round).join(', ')} (median ${Math.round(median(g.rps))}) | main-thread scavenges µs/request median ${Math.round(median(g.gc))}`),
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
}
