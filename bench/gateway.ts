// Gateway overhead: the same small completion sent straight to an engine that answers at once and
// through the gateway, in one run. Prints latency (p50/p99), streaming time to first byte, requests/s
// at 64 connections, and the gateway's peak RSS while relaying a 1 GB full-vocabulary body.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, cpus, totalmem } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import autocannon from 'autocannon';
import { execFileSync } from 'node:child_process';
import { memoryOf, percentile, root, spawnWithUrl, stop } from './support.ts';

const dir = mkdtempSync(join(tmpdir(), 'svc-bench-gw-'));
const engine = await spawnWithUrl(['--import', 'tsx', 'bench/instant-engine.ts', 'bench/instant'], process.env);
const config = {
  models: [
    {
      id: 'instant',
      default: true,
      checkpoint: 'bench/instant',
      engine: engine.url,
      gpu_shape: 'none',
      cost_per_second: 0,
      tokenizer: { kind: 'byte' },
      capabilities: {
        max_model_len: 32768,
        max_logprobs: 100,
        prompt_logprobs_full_vocab: true,
        full_vocab_max_prompt_tokens: 1024,
        max_output_work_tokens: 32000,
        max_inflight_per_key: 16,
        max_queued_per_key: 64,
        rate_limit_per_minute: 600,
      },
    },
  ],
};
writeFileSync(join(dir, 'models.json'), JSON.stringify(config));
// The gateway's store: PostgreSQL when DATABASE_URL is set (production's shape), else embedded PGlite,
// whose WebAssembly Postgres alone holds some 250-450 MB of the gateway's RSS.
const storeKind = process.env.DATABASE_URL ? 'postgres' : 'pglite';
// Measure what `npm start` runs: the compiled gateway.
execFileSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(root, 'tsconfig.build.json')], { stdio: 'inherit' });
const gateway = await spawnWithUrl(['dist/src/cli/main.js', 'serve'], { ...process.env, SVC_CONFIG: join(dir, 'models.json'), DATA_DIR: join(dir, 'data'), PORT: '0', LOG_LEVEL: 'warn' }, /listening on (http:\/\/\S+)/);

const body = JSON.stringify({ prompt: 'The quick brown fox', max_tokens: 16, temperature: 0 });
const streamBody = JSON.stringify({ prompt: 'The quick brown fox', max_tokens: 16, temperature: 0, stream: true });
// The engine sees the gateway's translated body; direct calls send the same thing the gateway would.
const engineBody = JSON.stringify({ model: 'bench/instant', prompt: 'The quick brown fox', max_tokens: 16, temperature: 0, top_p: 1, top_k: -1, n: 1 });
const engineStreamBody = JSON.stringify({ model: 'bench/instant', prompt: 'The quick brown fox', max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: false, continuous_usage_stats: false } });

const dispatcher = new Agent({ connections: 64, keepAliveTimeout: 60_000 });

async function timeOne(url: string, payload: string, firstByte: boolean): Promise<number> {
  const started = performance.now();
  const res = await request(url, { method: 'POST', body: payload, headers: { 'content-type': 'application/json' }, dispatcher });
  if (res.statusCode !== 200) throw new Error(`${url}: ${res.statusCode} ${await res.body.text()}`);
  let t = 0;
  for await (const chunk of res.body) {
    if (t === 0) t = performance.now() - started;
    void chunk;
    if (firstByte) break;
  }
  const total = performance.now() - started;
  if (firstByte) res.body.destroy();
  return firstByte ? t : total;
}

async function latency(url: string, payload: string, firstByte: boolean, n: number): Promise<{ p50: number; p99: number }> {
  for (let i = 0; i < 300; i++) await timeOne(url, payload, firstByte); // warm-up
  const samples: number[] = [];
  for (let i = 0; i < n; i++) samples.push(await timeOne(url, payload, firstByte));
  samples.sort((a, b) => a - b);
  return { p50: percentile(samples, 50), p99: percentile(samples, 99) };
}

// BENCH_PARTS=latency,throughput,relay picks parts (all by default).
const parts = new Set((process.env.BENCH_PARTS ?? 'latency,throughput,relay').split(','));

// The relay runs first, on the freshly started gateway, so its figure is the relay's own footprint and not
// heap left grown by the load phases.
// 1 GB full-vocabulary relay, read as fast as the client can, with and without gzip.
async function relay(gzip: boolean): Promise<{ bytes: number; seconds: number; peakMb: number; beforeMb: number }> {
  const beforeMb = memoryOf(gateway.child.pid!).rssMb;
  const started = performance.now();
  let peak = 0;
  const sampler = setInterval(() => (peak = Math.max(peak, memoryOf(gateway.child.pid!).rssMb)), 50);
  const res = await request(`${gateway.url}/v1/completions`, {
    method: 'POST',
    body: JSON.stringify({ prompt: 'x'.repeat(1000), max_tokens: 1, prompt_logprobs: -1 }),
    headers: { 'content-type': 'application/json', ...(gzip ? { 'accept-encoding': 'gzip' } : {}) },
  });
  let bytes = 0;
  for await (const chunk of res.body) bytes += chunk.length;
  clearInterval(sampler);
  return { bytes, seconds: (performance.now() - started) / 1000, peakMb: Math.max(peak, memoryOf(gateway.child.pid!).rssMb), beforeMb };
}
const skipped = { bytes: NaN, seconds: NaN, peakMb: NaN, beforeMb: NaN };
const plainRelay = parts.has('relay') ? await relay(false) : skipped;
const gzipRelay = parts.has('relay') ? await relay(true) : skipped;


// Interleave direct and gateway rounds so machine noise hits both alike.
const rounds = 4;
const perRound = 1000;
const acc = { direct: [] as number[][], gw: [] as number[][], directTtfb: [] as number[][], gwTtfb: [] as number[][] };
for (let r = 0; r < (parts.has('latency') ? rounds : 0); r++) {
  const d = await latency(`${engine.url}/v1/completions`, engineBody, false, perRound);
  const g = await latency(`${gateway.url}/v1/completions`, body, false, perRound);
  const ds = await latency(`${engine.url}/v1/completions`, engineStreamBody, true, perRound / 2);
  const gs = await latency(`${gateway.url}/v1/completions`, streamBody, true, perRound / 2);
  acc.direct.push([d.p50, d.p99]);
  acc.gw.push([g.p50, g.p99]);
  acc.directTtfb.push([ds.p50, ds.p99]);
  acc.gwTtfb.push([gs.p50, gs.p99]);
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const col = (rows: number[][], i: number) => median(rows.map((r) => r[i]));

async function throughput(url: string, payload: string): Promise<number> {
  const result = await autocannon({ url, method: 'POST', body: payload, headers: { 'content-type': 'application/json' }, connections: 64, duration: 10, pipelining: 1 });
  if (result.non2xx > 0 || result.errors > 0) throw new Error(`${url}: ${result.non2xx} non-2xx, ${result.errors} errors`);
  return result.requests.average;
}
const directRps = parts.has('throughput') ? await throughput(`${engine.url}/v1/completions`, engineBody) : NaN;
const gatewayRps = parts.has('throughput') ? await throughput(`${gateway.url}/v1/completions`, body) : NaN;

const f = (x: number | undefined) => (x === undefined ? 'n/a' : x.toFixed(3));
const lines = [
  `gateway overhead bench (store: ${storeKind}) — ${new Date().toISOString()} — ${cpus().length} cores (${cpus()[0]?.model}), ${Math.round(totalmem() / 2 ** 30)} GiB, Node ${process.version}`,
  `non-streaming latency ms (median of ${rounds} rounds x ${perRound}): direct p50 ${f(col(acc.direct, 0))} p99 ${f(col(acc.direct, 1))} | gateway p50 ${f(col(acc.gw, 0))} p99 ${f(col(acc.gw, 1))} | added p50 ${f(col(acc.gw, 0) - col(acc.direct, 0))} p99 ${f(col(acc.gw, 1) - col(acc.direct, 1))}`,
  `streaming time to first byte ms: direct p50 ${f(col(acc.directTtfb, 0))} | gateway p50 ${f(col(acc.gwTtfb, 0))} | added p50 ${f(col(acc.gwTtfb, 0) - col(acc.directTtfb, 0))} p99 ${f(col(acc.gwTtfb, 1) - col(acc.directTtfb, 1))}`,
  `requests/s at 64 connections (10 s, autocannon in-process): direct ${Math.round(directRps)} | gateway ${Math.round(gatewayRps)}`,
  `1 GB full-vocabulary relay: plain ${(plainRelay.bytes / 2 ** 20).toFixed(0)} MiB in ${plainRelay.seconds.toFixed(1)} s, gateway RSS ${plainRelay.beforeMb.toFixed(0)} MB before, peak ${plainRelay.peakMb.toFixed(0)} MB | gzip ${(gzipRelay.bytes / 2 ** 20).toFixed(0)} MiB on the wire in ${gzipRelay.seconds.toFixed(1)} s, RSS ${gzipRelay.beforeMb.toFixed(0)} MB before, peak ${gzipRelay.peakMb.toFixed(0)} MB`,
];
process.stdout.write(`${lines.join('\n')}\n`);

await dispatcher.close();
await stop(gateway.child);
await stop(engine.child);
rmSync(dir, { recursive: true, force: true });
