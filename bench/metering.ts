/**
 * Metering alone, in process: no HTTP, no engine, no projections. BENCH_WORKERS (default 64) loops
 * each admit a request on one of BENCH_KEYS (default 384) keys, wait for its reservation to be durable,
 * and settle it, as the gateway's route does around an engine that answers at once. It prints, per
 * request: this process's CPU, what it allocated, and what its scavenges kept (V8's
 * `--trace-gc-nvp` figures: bytes that survived a scavenge, bytes promoted to the old generation, the
 * main-thread pause and the parallel helpers' time). What survives a scavenge is what the collector
 * pays for, so this is the bench for metering's share of the gateway's CPU (BENCHMARKS.md, gateway).
 * PostgreSQL when DATABASE_URL is set (a scratch database), else PGlite in memory.
 *   node --import tsx bench/metering.ts        (BENCH_SECONDS, default 8, after a 3 s warm-up)
 */
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { cpus, loadavg } from 'node:os';
import { createInterface } from 'node:readline';
import pino from 'pino';
import { CommandHandler } from '../src/command-handler/index.ts';
import { Metering, type Usage } from '../src/metering/index.ts';
import { openEventStore } from '../src/store/index.ts';
import type { RequestFactsData } from '../events/index.ts';
import { root, scratchDatabase } from './support.ts';

const seconds = Number(process.env.BENCH_SECONDS ?? 8);
const workers = Number(process.env.BENCH_WORKERS ?? 64);
const keyCount = Number(process.env.BENCH_KEYS ?? 384);
const warmupSeconds = 3;

if (process.argv[2] === 'load') await load(process.argv[3] || undefined);
else await main();

/** The parent: runs the load in a child traced by V8, and reads the trace of its measured part. */
async function main(): Promise<void> {
  const startedAt = new Date();
  const db = process.env.DATABASE_URL ? await scratchDatabase(process.env.DATABASE_URL, 'metering') : null;
  try {
    const child = spawn(process.execPath, ['--max-semi-space-size=64', '--trace-gc', '--trace-gc-nvp', '--import', 'tsx', 'bench/metering.ts', 'load', db?.url ?? ''], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] });
    let measuring = false;
    let result: { requests: number; cpuMicros: number } | null = null;
    let allocated = 0;
    const scavenges: { pause: number; helpers: number; promoted: number; survived: number }[] = [];
    let fullCollections = 0;
    for await (const line of createInterface({ input: child.stdout! })) {
      if (line === 'measuring') measuring = true;
      else if (line.startsWith('{')) {
        result = JSON.parse(line);
        measuring = false;
      } else if (measuring && line.includes(' gc=')) {
        const field = (name: string) => Number(new RegExp(`\\b${name}=([\\d.]+)`).exec(line)?.[1] ?? NaN);
        allocated += field('allocated');
        if (/ gc=s /.test(line)) scavenges.push({ pause: field('pause'), helpers: field('background.scavenge.parallel'), promoted: field('promoted'), survived: field('new_space_survived') });
        else fullCollections++;
      }
    }
    if (!result) throw new Error('the load process printed no result');
    const per = (total: number) => total / result!.requests;
    const sum = (pick: (s: (typeof scavenges)[number]) => number) => scavenges.reduce((a, s) => a + pick(s), 0);
    const kb = (bytes: number) => `${(bytes / 1024).toFixed(2)} KB`;
    process.stdout.write(
      [
        `metering alone, in process (${workers} workers, ${keyCount} keys, store: ${db ? 'postgres' : 'pglite'}) — ${startedAt.toISOString()} to ${new Date().toISOString()} — ${cpus().length} cores (${cpus()[0]?.model}), Node ${process.version}, load average ${loadavg()[0].toFixed(1)} at end`,
        `${result.requests} requests in ${seconds} s: ${Math.round(result.requests / seconds)}/s, CPU ${Math.round(per(result.cpuMicros))} µs a request (this process, all threads)`,
        `per request (from the scavenges of the measured part): allocated ${kb(per(allocated))}, survived a scavenge ${kb(per(sum((s) => s.survived)))}, promoted ${kb(per(sum((s) => s.promoted)))}; scavenges ${scavenges.length}, main-thread pause ${(per(sum((s) => s.pause)) * 1000).toFixed(1)} µs + parallel helpers ${(per(sum((s) => s.helpers)) * 1000).toFixed(1)} µs a request; full collections ${fullCollections}`,
      ].join('\n') + '\n',
    );
  } finally {
    await db?.drop();
  }
}

/** The child: the load itself. Prints `measuring` after the warm-up, then its figures as JSON. */
async function load(databaseUrl: string | undefined): Promise<void> {
  const store = await openEventStore(databaseUrl ? { databaseUrl, purpose: 'bench metering' } : { inMemory: true });
  const handler = new CommandHandler({ store });
  const meter = new Metering({ store, handler, logger: pino({ level: 'warn' }), reservationTtlMs: 60_000, dailySpendCap: null });
  const keys = Array.from({ length: keyCount }, (_, i) => `bench${i}_${randomUUID().slice(0, 8)}`);
  const budgets = { monthly_token_budget: null, daily_token_budget: null, monthly_input_token_budget: null, monthly_output_token_budget: null, monthly_harvest_jobs: null };
  const usage: Usage = { inputTokens: 5, outputTokens: 16, status: 200, latencyMs: 1, gpuSeconds: 0.01, costMicros: 0, pricePerGpuSecondMicros: null, basis: 'engine_usage', disconnected: false };
  let next = 0;
  let done = 0;
  let stopAt = Date.now() + warmupSeconds * 1000;
  const loop = async () => {
    while (Date.now() < stopAt) {
      const keyId = keys[next++ % keys.length];
      const facts: RequestFactsData = { request_id: `req_${randomUUID().replaceAll('-', '')}`, key_prefix: 'svc_bench', email: 'bench@example.com', client_ip: '127.0.0.1', endpoint: '/v1/completions', model: 'instant', user: null, workload: null };
      const admission = await meter.admit({
        key: async () => ({ keyId, status: 'active', budgets }),
        keyId,
        facts,
        inputTokens: 5,
        maxTokens: 16,
        maxTokensRequested: 16,
        choices: 1,
        limits: { maxActive: 1000, maxQueued: 1000, perMinute: 1_000_000 },
        signal: new AbortController().signal,
      });
      await admission.durable;
      void meter.settle(admission, facts, usage);
      done++;
    }
  };
  await Promise.all(Array.from({ length: workers }, loop));
  await handler.settled();
  process.stdout.write('measuring\n');
  done = 0;
  stopAt = Date.now() + seconds * 1000;
  const cpu = process.cpuUsage();
  await Promise.all(Array.from({ length: workers }, loop));
  const used = process.cpuUsage(cpu);
  process.stdout.write(`${JSON.stringify({ requests: done, cpuMicros: used.user + used.system })}\n`);
  await meter.stop(); // waits for the settlements under way, and the handler's appends
  await store.close();
}
