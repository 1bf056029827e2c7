// Gateway overhead, metering on next to metering off, in one run: the same small completion sent
// straight to an engine and through two gateway processes built from the same code and configuration,
// one with metering on (reservations and settlements appended to the store) and one with
// SVC_METERING=off. Prints, for each: latency (p50/p99) against an engine that answers at once,
// streaming time to first byte, requests/s at 64 connections, the added p50 against an engine that
// takes 20 ms, and the gateway's RSS while relaying a 1 GB full-vocabulary body. Beside them, in the same
// run: Portkey's open-source gateway (bench/support.ts startPortkey: installed into a scratch folder on
// first use; BENCH_PORTKEY=off leaves it out) in front of the same engines, and, for the throughput
// part, a third gateway with metering on that does not keep the analyst tables (SVC_PROJECTIONS=off),
// so that the projections' share of a metered request's CPU (gateway and PostgreSQL) is read off.
//
// Keys: every /v1/completions call needs one, and metering allows a key 600 request starts per rolling
// minute and 16 running at once (the bench keeps the production limits). Each gateway gets its own pool
// of BENCH_KEYS keys (default 384), used round-robin by every request of every phase; the bench counts
// the requests each gateway received and prints the most any key started, which stays under 600 for
// the whole run (so under 600 in any minute) unless the pool is too small, in which case the metered
// gateway answers 429 and the bench fails rather than report it.
//
// Against the 20 ms engine the bench reports two figures, because a metered key's first request in a
// gateway process takes that process's slot lease on the key and waits for the append before the
// engine call, while a key in steady use starts the call at once (README, "slot leases"): first one
// request on each of BENCH_FRESH_KEYS (default 100) unused keys, then, after one request on every key
// of the pool, the steady-state rounds.
//
// Store: with DATABASE_URL each gateway gets a fresh PostgreSQL database of its own (created next to the
// one named, dropped at the end); without it, each its own embedded PGlite.
//
// The floor (PostgreSQL only, part `floor`, last): a metered response waits for its reservation's
// commit, so the same run measures what a commit costs here: a one-row INSERT through `pg` and the
// store's append of one event (the reservation's path), each back to back and after 2 ms idle (a
// sequential client idles between requests), the append split into its statement and the rest.
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, cpus, totalmem, loadavg } from 'node:os';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import { Agent, request } from 'undici';
import pg from 'pg';
import { openEventStore } from '../src/store/index.ts';
import { KeyPool, benchCompletionBody, benchModel, buildGateway, cpuPerRequest, gatewayEnv, gatewayServeArgs, issueKeys, median, memoryOf, percentile, portkeyHeaders, portkeyVersion, postLoad, sampledMs, scratchDatabase, spawnWithUrl, startPortkey, stop } from './support.ts';

// BENCH_PARTS=latency,slow,throughput,relay,floor picks parts (all by default).
const parts = new Set((process.env.BENCH_PARTS ?? 'latency,slow,throughput,relay,floor').split(','));
const keyCount = Number(process.env.BENCH_KEYS ?? 384);
// The throughput runs: 64 connections sharing this many keys (users' load: a few keys, several requests
// in flight on each); BENCH_LOAD_KEYS=384 spreads them over the whole pool, one request per key at a time.
const loadKeyCount = Math.min(keyCount, Number(process.env.BENCH_LOAD_KEYS ?? 16));
const throughputSeconds = Number(process.env.BENCH_SECONDS ?? 10);
// A key's first request in a process takes the process's slot lease on it (metering waits for that
// append before the engine call); the slow part samples that on this many unused keys per gateway.
const freshKeyCount = Number(process.env.BENCH_FRESH_KEYS ?? 100);
const startedAt = new Date();
const loadAtStart = loadavg()[0];

const dir = mkdtempSync(join(tmpdir(), 'svc-bench-gw-'));
const cleanups: (() => Promise<void>)[] = [async () => rmSync(dir, { recursive: true, force: true })];
async function cleanup(): Promise<void> {
  for (const fn of cleanups.reverse()) await fn().catch((err) => process.stderr.write(`cleanup: ${err}\n`));
}

try {
  await main();
} finally {
  await cleanup();
}

async function main(): Promise<void> {
  const engine = await spawnWithUrl(['--import', 'tsx', 'bench/instant-engine.ts', 'bench/instant'], process.env);
  cleanups.push(() => stop(engine.child));
  const slowEngine = await spawnWithUrl(['--import', 'tsx', 'bench/instant-engine.ts', 'bench/slow20', '20'], process.env);
  cleanups.push(() => stop(slowEngine.child));
  // Portkey's open-source gateway in front of the same engines, for the figures the issue compares with.
  const portkey = await startPortkey();
  if (portkey) cleanups.push(() => stop(portkey.child));
  // The throughput runs send 16 keys' requests at full speed (some 50 request starts a second per key):
  // the instant model lets a key start that many (the production 600 a minute would answer 429), its
  // other limits (16 running per key) the production ones.
  const instant = benchModel('instant', 'bench/instant', engine.url, true);
  instant.capabilities = { ...(instant.capabilities as Record<string, unknown>), rate_limit_per_minute: 1_000_000 };
  writeFileSync(join(dir, 'models.json'), JSON.stringify({ models: [instant, benchModel('slow20', 'bench/slow20', slowEngine.url, false)] }));

  // The gateways' stores: PostgreSQL when DATABASE_URL is set (production's shape), else embedded PGlite,
  // whose WebAssembly Postgres alone holds some 250-450 MB of the gateway's RSS.
  const storeKind = process.env.DATABASE_URL ? 'postgres' : 'pglite';
  buildGateway();

  interface Gw {
    /**
     * Metering on, off, or on in a process that does not keep the analyst tables (what the projections
     * cost), or on with LOG_LEVEL=warn (no line per request: what the bench measured before).
     */
    name: 'on' | 'off' | 'noproj' | 'quiet';
    url: string;
    pid: number;
    pool: KeyPool;
    /** The throughput runs' keys: the first `loadKeyCount` of the pool, round-robin over 64 connections. */
    load: KeyPool;
    /** Keys no request has used, one per first-request sample of the slow part. */
    fresh: string[];
  }
  async function startGateway(name: Gw['name']): Promise<Gw> {
    const env = gatewayEnv(dir, `data-${name}`, { SVC_METERING: name === 'off' ? 'off' : 'on', SVC_PROJECTIONS: name === 'noproj' ? 'off' : 'on', ...(name === 'quiet' ? { LOG_LEVEL: 'warn' } : {}) });
    if (process.env.DATABASE_URL) {
      const db = await scratchDatabase(process.env.DATABASE_URL, `gw_${name}`);
      cleanups.push(db.drop);
      env.DATABASE_URL = db.url;
    }
    // Its log (info: a line per request, as `npm start` writes it) goes to a file, as a service manager keeps it.
    const gw = await spawnWithUrl(gatewayServeArgs(process.env.BENCH_PROF === name ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_PROF_DIR ?? dir}`] : []), env, /listening on (http:\/\/\S+)/, join(dir, `gateway-${name}.log`));
    cleanups.push(() => stop(gw.child));
    const keys = await issueKeys(gw.url, keyCount + freshKeyCount, `gw-${name}`);
    return { name, url: gw.url, pid: gw.child.pid!, pool: new KeyPool(keys.slice(0, keyCount)), load: new KeyPool(keys.slice(0, loadKeyCount)), fresh: keys.slice(keyCount) };
  }
  const on = await startGateway('on');
  const off = await startGateway('off');
  const noproj = parts.has('throughput') ? await startGateway('noproj') : null;
  const quiet = parts.has('throughput') ? await startGateway('quiet') : null;

  const body = benchCompletionBody;
  const streamBody = JSON.stringify({ prompt: 'The quick brown fox', max_tokens: 16, temperature: 0, stream: true });
  const slowBody = JSON.stringify({ model: 'slow20', prompt: 'The quick brown fox', max_tokens: 16, temperature: 0 });
  // The engine sees the gateway's translated body; direct calls send the same thing the gateway would.
  const engineBody = JSON.stringify({ model: 'bench/instant', prompt: 'The quick brown fox', max_tokens: 16, temperature: 0, top_p: 1, top_k: -1, n: 1 });
  const engineStreamBody = JSON.stringify({ model: 'bench/instant', prompt: 'The quick brown fox', max_tokens: 16, temperature: 0, stream: true, stream_options: { include_usage: true, continuous_usage_stats: false } });
  const slowEngineBody = JSON.stringify({ model: 'bench/slow20', prompt: 'The quick brown fox', max_tokens: 16, temperature: 0, top_p: 1, top_k: -1, n: 1 });

  const dispatcher = new Agent({ connections: 64, keepAliveTimeout: 60_000 });
  cleanups.push(() => dispatcher.close());

  /** A target: a URL, a body, and the gateway whose keys it uses (none: the engine, which takes a dummy header). */
  type Target = { url: string; payload: string; gw: Gw | null; key?: string; keys?: KeyPool; headers?: Record<string, string> };
  /** Portkey in front of `engineUrl`, when it runs. */
  const viaPortkey = (engineUrl: string, payload: string): Target | null => (portkey ? { url: `${portkey.url}/v1/completions`, payload, gw: null, headers: portkeyHeaders(engineUrl) } : null);
  const auth = (t: Target) => (t.key ? `Bearer ${t.key}` : t.keys ? t.keys.next() : t.gw ? t.gw.pool.next() : 'Bearer direct');

  async function timeOne(t: Target, firstByte: boolean): Promise<number> {
    const started = performance.now();
    const res = await request(t.url, { method: 'POST', body: t.payload, headers: { 'content-type': 'application/json', authorization: auth(t), ...t.headers }, dispatcher });
    if (res.statusCode !== 200) throw new Error(`${t.url}: ${res.statusCode} ${await res.body.text()}`);
    let ttfb = 0;
    for await (const chunk of res.body) {
      if (ttfb === 0) ttfb = performance.now() - started;
      void chunk;
      if (firstByte) break;
    }
    const total = performance.now() - started;
    if (firstByte) res.body.destroy();
    return firstByte ? ttfb : total;
  }

  /**
   * Against the delayed engine: one request's time split at the engine, from the epoch times its answer
   * carries: `before` (sent until the engine had the request) and `after` (engine answered until the
   * client had the last byte). The client's and the engine's clocks may differ by a constant, which
   * cancels when two gateways are compared.
   */
  const split = { direct: { before: [] as number[], after: [] as number[] }, on: { before: [] as number[], after: [] as number[] }, off: { before: [] as number[], after: [] as number[] } };
  async function timeSplit(t: Target, into: { before: number[]; after: number[] }): Promise<number> {
    const sentAt = performance.timeOrigin + performance.now();
    const started = performance.now();
    const res = await request(t.url, { method: 'POST', body: t.payload, headers: { 'content-type': 'application/json', authorization: auth(t), ...t.headers }, dispatcher });
    const text = await res.body.text();
    const total = performance.now() - started;
    const doneAt = performance.timeOrigin + performance.now();
    if (res.statusCode !== 200) throw new Error(`${t.url}: ${res.statusCode} ${text}`);
    const answer = JSON.parse(text) as { bench_received_at: number; bench_answered_at: number };
    into.before.push(answer.bench_received_at - sentAt);
    into.after.push(doneAt - answer.bench_answered_at);
    return total;
  }
  async function slowLatency(t: Target, into: { before: number[]; after: number[] }, n: number, warmup: number, gapMs: number): Promise<{ p50: number; p99: number }> {
    for (let i = 0; i < warmup; i++) await timeOne(t, false);
    const samples = await sampledMs(n, gapMs, () => timeSplit(t, into));
    return { p50: percentile(samples, 50), p99: percentile(samples, 99) };
  }

  async function latency(t: Target, firstByte: boolean, n: number, warmup: number, gapMs = 0): Promise<{ p50: number; p99: number }> {
    for (let i = 0; i < warmup; i++) await timeOne(t, firstByte);
    const samples = await sampledMs(n, gapMs, () => timeOne(t, firstByte));
    return { p50: percentile(samples, 50), p99: percentile(samples, 99) };
  }

  // The relay runs first, on the freshly started gateways, so its figure is the relay's own footprint and
  // not heap left grown by the load phases. 1 GB full-vocabulary relay, read as fast as the client can,
  // with and without gzip.
  async function relay(gw: Gw, gzip: boolean): Promise<{ bytes: number; seconds: number; peakMb: number; beforeMb: number }> {
    const beforeMb = memoryOf(gw.pid).rssMb;
    const started = performance.now();
    let peak = 0;
    const sampler = setInterval(() => (peak = Math.max(peak, memoryOf(gw.pid).rssMb)), 50);
    const res = await request(`${gw.url}/v1/completions`, {
      method: 'POST',
      body: JSON.stringify({ prompt: 'x'.repeat(1000), max_tokens: 1, prompt_logprobs: -1 }),
      headers: { 'content-type': 'application/json', authorization: gw.pool.next(), ...(gzip ? { 'accept-encoding': 'gzip' } : {}) },
    });
    if (res.statusCode !== 200) throw new Error(`relay: ${res.statusCode} ${await res.body.text()}`);
    let bytes = 0;
    for await (const chunk of res.body) bytes += chunk.length;
    clearInterval(sampler);
    return { bytes, seconds: (performance.now() - started) / 1000, peakMb: Math.max(peak, memoryOf(gw.pid).rssMb), beforeMb };
  }
  const skipped = { bytes: NaN, seconds: NaN, peakMb: NaN, beforeMb: NaN };
  const relays = new Map<Gw, { plain: typeof skipped; gzip: typeof skipped }>();
  for (const gw of [on, off]) {
    const plain = parts.has('relay') ? await relay(gw, false) : skipped;
    const gzip = parts.has('relay') ? await relay(gw, true) : skipped;
    relays.set(gw, { plain, gzip });
  }

  // Every key once before any timing: a key's first metered request opens its meter day (loads, an
  // opening balance and an append), a cost paid once per key and day, not per request.
  for (const gw of [on, off, ...(noproj ? [noproj] : []), ...(quiet ? [quiet] : [])]) {
    await Promise.all(
      Array.from({ length: 16 }, async () => {
        while (gw.pool.sent < gw.pool.keys.length) await timeOne({ url: `${gw.url}/v1/completions`, payload: body, gw }, false);
      }),
    );
  }

  type Pair = { p50: number; p99: number };
  const col = (rows: Pair[], k: keyof Pair) => median(rows.map((r) => r[k]));

  // Interleave direct, metered and unmetered rounds so machine noise hits all three alike.
  const rounds = 4;
  const perRound = 1000;
  const fast = { direct: [] as Pair[], on: [] as Pair[], off: [] as Pair[], portkey: [] as Pair[] };
  const ttfb = { direct: [] as Pair[], on: [] as Pair[], off: [] as Pair[] };
  const slow = { direct: [] as Pair[], on: [] as Pair[], off: [] as Pair[], portkey: [] as Pair[] };
  const gwTarget = (gw: Gw, payload: string): Target => ({ url: `${gw.url}/v1/completions`, payload, gw });
  for (let r = 0; r < (parts.has('latency') ? rounds : 0); r++) {
    fast.direct.push(await latency({ url: `${engine.url}/v1/completions`, payload: engineBody, gw: null }, false, perRound, 300));
    fast.on.push(await latency(gwTarget(on, body), false, perRound, 300));
    fast.off.push(await latency(gwTarget(off, body), false, perRound, 300));
    const pk = viaPortkey(engine.url, engineBody);
    if (pk) fast.portkey.push(await latency(pk, false, perRound, 300));
    ttfb.direct.push(await latency({ url: `${engine.url}/v1/completions`, payload: engineStreamBody, gw: null }, true, perRound / 2, 100));
    ttfb.on.push(await latency(gwTarget(on, streamBody), true, perRound / 2, 100));
    ttfb.off.push(await latency(gwTarget(off, streamBody), true, perRound / 2, 100));
  }
  // Against an engine that takes 20 ms (a timer in the engine process: its own jitter is in all three).
  // BENCH_SLOW_GAP_MS pauses between these requests (diagnostic: the previous request's settlement then
  // finishes before the next one is admitted).
  const slowGapMs = Number(process.env.BENCH_SLOW_GAP_MS ?? 0);
  const slowRounds = 4;
  const slowPerRound = 250;
  // First, each fresh key's first request (direct, on, off interleaved): the metered one takes its slot lease.
  const firstUse = { direct: [] as number[], on: [] as number[], off: [] as number[] };
  const unused = { direct: { before: [] as number[], after: [] as number[] }, on: { before: [] as number[], after: [] as number[] }, off: { before: [] as number[], after: [] as number[] } };
  if (parts.has('slow')) {
    for (let i = 0; i < freshKeyCount; i++) {
      firstUse.direct.push(await timeSplit({ url: `${slowEngine.url}/v1/completions`, payload: slowEngineBody, gw: null }, unused.direct));
      firstUse.on.push(await timeSplit({ ...gwTarget(on, slowBody), key: on.fresh[i] }, unused.on));
      firstUse.off.push(await timeSplit({ ...gwTarget(off, slowBody), key: off.fresh[i] }, unused.off));
    }
    // Then one request on every key of the pool, as a key in steady use has had in the last minute.
    for (let i = 0; i < keyCount; i++) {
      await timeOne(gwTarget(on, slowBody), false);
      await timeOne(gwTarget(off, slowBody), false);
    }
  }
  for (let r = 0; r < (parts.has('slow') ? slowRounds : 0); r++) {
    slow.direct.push(await slowLatency({ url: `${slowEngine.url}/v1/completions`, payload: slowEngineBody, gw: null }, split.direct, slowPerRound, 20, slowGapMs));
    slow.on.push(await slowLatency(gwTarget(on, slowBody), split.on, slowPerRound, 20, slowGapMs));
    slow.off.push(await slowLatency(gwTarget(off, slowBody), split.off, slowPerRound, 20, slowGapMs));
    // Portkey rewrites the engine's body (the engine's timing fields do not come through): end to end only.
    const pk = viaPortkey(slowEngine.url, slowEngineBody);
    if (pk) slow.portkey.push(await latency(pk, false, slowPerRound, 20, slowGapMs));
  }

  /** CPU per request of each throughput run, µs: the gateway, the engine, the client (this process), PostgreSQL. */
  type Run = 'direct' | 'on' | 'off' | 'noproj' | 'quiet' | 'wide' | 'portkey';
  const cpu = Object.fromEntries((['direct', 'on', 'off', 'noproj', 'quiet', 'wide', 'portkey'] as Run[]).map((r) => [r, [] as Record<string, number>[]])) as Record<Run, Record<string, number>[]>;
  const rps = Object.fromEntries(Object.keys(cpu).map((r) => [r, [] as number[]])) as Record<Run, number[]>;
  async function throughput(run: Run, t: Target): Promise<void> {
    const serving = t.gw?.pid ?? (run === 'portkey' ? portkey!.child.pid! : null);
    const meter = cpuPerRequest({ ...(serving !== null ? { gateway: serving } : {}), engine: engine.child.pid!, client: process.pid });
    // Every request takes the next key of the run's keys (the engine gets a dummy header: same client work).
    const result = await postLoad({ url: t.url, body: t.payload, connections: 64, seconds: throughputSeconds, authorization: () => auth(t), headers: t.headers, label: `${run} (${t.url})` });
    cpu[run].push(meter.stop(result.requests.total));
    rps[run].push(result.requests.average);
  }
  // Alternated so that machine noise and the store's growth hit every variant alike: each run once in
  // order, then once in reverse, after the direct run. `on` is the headline (users' load: 16 keys over
  // 64 connections, the default log level, as `npm start` runs); `quiet` the same with LOG_LEVEL=warn;
  // `wide` the same gateway with the 64 connections spread over all its keys; `noproj` without the
  // projections in the process.
  const order: Run[] = ['off', 'on', 'portkey', 'quiet', 'wide', 'noproj'];
  if (parts.has('throughput')) {
    const pk = viaPortkey(engine.url, engineBody);
    const targetOf = (run: Run): Target | null => {
      switch (run) {
        case 'direct':
          return { url: `${engine.url}/v1/completions`, payload: engineBody, gw: null };
        case 'portkey':
          return pk;
        case 'wide':
          return { ...gwTarget(on, body), keys: on.pool };
        default: {
          const gw = { on, off, noproj: noproj!, quiet: quiet! }[run];
          return { ...gwTarget(gw, body), keys: gw.load };
        }
      }
    };
    for (const run of ['direct', ...order, ...[...order].reverse()] as Run[]) {
      const t = targetOf(run);
      if (t) await throughput(run, t);
    }
  }
  const mean = (xs: number[]) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : NaN);

  const f = (x: number | undefined) => (x === undefined || Number.isNaN(x) ? 'n/a' : x.toFixed(3));
  const added = (g: Pair[], d: Pair[], k: keyof Pair) => f(col(g, k) - col(d, k));
  const relayLine = (gw: Gw) => {
    const { plain, gzip } = relays.get(gw)!;
    return `1 GB full-vocabulary relay, metering ${gw.name}: plain ${(plain.bytes / 2 ** 20).toFixed(0)} MiB in ${plain.seconds.toFixed(1)} s, gateway RSS ${plain.beforeMb.toFixed(0)} MB before, peak ${plain.peakMb.toFixed(0)} MB | gzip ${(gzip.bytes / 2 ** 20).toFixed(0)} MiB on the wire in ${gzip.seconds.toFixed(1)} s, RSS ${gzip.beforeMb.toFixed(0)} MB before, peak ${gzip.peakMb.toFixed(0)} MB`;
  };
  const cpuOf = (name: Run, k: string) => mean(cpu[name].map((c) => c[k]));
  const runName: Record<Run, string> = {
    direct: 'direct',
    on: `metering on (${loadKeyCount} keys)`,
    off: `metering off (${loadKeyCount} keys)`,
    quiet: `metering on, LOG_LEVEL=warn (${loadKeyCount} keys)`,
    wide: `metering on (${keyCount} keys)`,
    noproj: `metering on, no projections in the process (${loadKeyCount} keys)`,
    portkey: `Portkey ${portkeyVersion}`,
  };
  const addedP50 = (rows: Pair[]) => col(rows, 'p50') - col(fast.direct, 'p50');
  const slowAddedP50 = (rows: Pair[]) => col(rows, 'p50') - col(slow.direct, 'p50');
  const pkName = `Portkey ${portkeyVersion}`;
  const lines = [
    `gateway overhead bench, metering on vs off${portkey ? `, beside ${pkName}` : ''} (store: ${storeKind}) — ${startedAt.toISOString()} to ${new Date().toISOString()} — ${cpus().length} cores (${cpus()[0]?.model}), ${Math.round(totalmem() / 2 ** 30)} GiB, Node ${process.version}, load average ${loadAtStart.toFixed(1)} at start, ${loadavg()[0].toFixed(1)} at end`,
    `non-streaming latency ms, engine answers at once (median of ${rounds} rounds x ${perRound}): direct p50 ${f(col(fast.direct, 'p50'))} p99 ${f(col(fast.direct, 'p99'))} | metering on p50 ${f(col(fast.on, 'p50'))} p99 ${f(col(fast.on, 'p99'))}, added p50 ${added(fast.on, fast.direct, 'p50')} p99 ${added(fast.on, fast.direct, 'p99')} | metering off p50 ${f(col(fast.off, 'p50'))} p99 ${f(col(fast.off, 'p99'))}, added p50 ${added(fast.off, fast.direct, 'p50')} p99 ${added(fast.off, fast.direct, 'p99')} | ${pkName} p50 ${f(col(fast.portkey, 'p50'))} p99 ${f(col(fast.portkey, 'p99'))}, added p50 ${added(fast.portkey, fast.direct, 'p50')} p99 ${added(fast.portkey, fast.direct, 'p99')}`,
    `  metered added p50: ${f(addedP50(fast.on) - addedP50(fast.off))} over unmetered (target <= 0.3), ${f(addedP50(fast.on) - addedP50(fast.portkey))} over Portkey's (target < 0)`,
    `streaming time to first byte ms (median of ${rounds} rounds x ${perRound / 2}): direct p50 ${f(col(ttfb.direct, 'p50'))} | metering on p50 ${f(col(ttfb.on, 'p50'))}, added p50 ${added(ttfb.on, ttfb.direct, 'p50')} p99 ${added(ttfb.on, ttfb.direct, 'p99')} | metering off p50 ${f(col(ttfb.off, 'p50'))}, added p50 ${added(ttfb.off, ttfb.direct, 'p50')} p99 ${added(ttfb.off, ttfb.direct, 'p99')}`,
    `non-streaming latency ms, engine takes 20 ms, keys in steady use (median of ${slowRounds} rounds x ${slowPerRound}${slowGapMs > 0 ? `, ${slowGapMs} ms between requests` : ''}): direct p50 ${f(col(slow.direct, 'p50'))} p99 ${f(col(slow.direct, 'p99'))} | metering on p50 ${f(col(slow.on, 'p50'))}, added p50 ${added(slow.on, slow.direct, 'p50')} p99 ${added(slow.on, slow.direct, 'p99')} | metering off p50 ${f(col(slow.off, 'p50'))}, added p50 ${added(slow.off, slow.direct, 'p50')} p99 ${added(slow.off, slow.direct, 'p99')} | ${pkName} p50 ${f(col(slow.portkey, 'p50'))}, added p50 ${added(slow.portkey, slow.direct, 'p50')} p99 ${added(slow.portkey, slow.direct, 'p99')}`,
    `  metering's own share at p50 (on - off): ${f(slowAddedP50(slow.on) - slowAddedP50(slow.off))} (target <= 0.2); metered added p50 over Portkey's ${f(slowAddedP50(slow.on) - slowAddedP50(slow.portkey))}`,
    `a key's first request in its gateway process, engine takes 20 ms (${freshKeyCount} fresh keys, one request each; metered, it takes the process's slot lease, so the engine waits for that append): direct p50 ${f(median(firstUse.direct))} | metering on p50 ${f(median(firstUse.on))}, added ${f(median(firstUse.on) - median(firstUse.direct))} | metering off p50 ${f(median(firstUse.off))}, added ${f(median(firstUse.off) - median(firstUse.direct))} | on - off ${f(median(firstUse.on) - median(firstUse.off))}`,
    `  split at the engine, p50 ms (before: sent until the engine had it; after: engine answered until the client had it; offsets between clocks cancel in on - off): direct before ${f(median(split.direct.before))} after ${f(median(split.direct.after))} | metering on before ${f(median(split.on.before))} after ${f(median(split.on.after))} | metering off before ${f(median(split.off.before))} after ${f(median(split.off.after))} | on - off: before ${f(median(split.on.before) - median(split.off.before))}, after ${f(median(split.on.after) - median(split.off.after))}`,
    `requests/s at 64 connections (${throughputSeconds} s each, autocannon in-process; runs direct, then ${order.join(', ')}, then the same reversed): direct ${rps.direct.map(Math.round).join(', ')} | ${(['on', 'off', 'quiet', 'wide', 'noproj', 'portkey'] as Run[]).map((r) => `${runName[r]} ${rps[r].map(Math.round).join(', ')} (mean ${Math.round(mean(rps[r]))})`).join(' | ')}`,
    `  metered / Portkey ${(mean(rps.on) / mean(rps.portkey)).toFixed(2)} (target >= 2); metered / unmetered ${(mean(rps.on) / mean(rps.off)).toFixed(2)}; metered with LOG_LEVEL=warn / Portkey ${(mean(rps.quiet) / mean(rps.portkey)).toFixed(2)}; metered over ${keyCount} keys / Portkey ${(mean(rps.wide) / mean(rps.portkey)).toFixed(2)}`,
    `  CPU per request in those runs, µs (mean; user + system, read from /proc; gateway: the process serving the run): ${(['direct', 'on', 'quiet', 'wide', 'noproj', 'off', 'portkey'] as Run[]).map((r) => `${runName[r]}: ${['gateway', 'postgres', 'engine', 'client'].filter((k) => !Number.isNaN(cpuOf(r, k))).map((k) => `${k} ${Math.round(cpuOf(r, k))}`).join(', ')}`).join(' | ')} (postgres: this machine's server processes, the idle gateways' included)`,
    `  gateway CPU per request, metered / unmetered: ${(cpuOf('on', 'gateway') / cpuOf('off', 'gateway')).toFixed(2)} (target <= 2); the log line's share (on - quiet): ${Math.round(cpuOf('on', 'gateway') - cpuOf('quiet', 'gateway'))} µs; the projections' share (on - on without projections): gateway ${Math.round(cpuOf('on', 'gateway') - cpuOf('noproj', 'gateway'))} µs, PostgreSQL ${Math.round(cpuOf('on', 'postgres') - cpuOf('noproj', 'postgres'))} µs of ${Math.round(cpuOf('on', 'postgres'))}`,
    relayLine(on),
    relayLine(off),
    `keys: ${keyCount} per gateway for the latency parts, round-robin: metering on's took ${on.pool.sent} requests (at most ${on.pool.most} starts on any key; limit 600 per minute on slow20); the throughput runs' ${loadKeyCount} keys on the instant model (its per-minute limit raised so that they can run at full speed)`,
  ];
  if (parts.has('floor') && process.env.DATABASE_URL) lines.push(await commitFloor(process.env.DATABASE_URL));
  process.stdout.write(`${lines.join('\n')}\n`);
}

/**
 * p50s (ms) of `fn` run 1,000 times back to back and 1,000 times each after 2 ms idle, after a warm-up;
 * with `part`, also the p50s of the figure (ms) it reads after each call.
 */
async function backToBackAndIdle(fn: () => Promise<unknown>, part?: () => number): Promise<{ busy: number; idle: number; partBusy: number; partIdle: number }> {
  for (let i = 0; i < 300; i++) await fn();
  const p50s = async (gapMs: number) => {
    const readings: number[] = [];
    const whole = await sampledMs(1000, gapMs, async () => {
      const t = performance.now();
      await fn();
      const ms = performance.now() - t;
      if (part) readings.push(part());
      return ms;
    });
    return [percentile(whole, 50), median(readings)];
  };
  const [busy, partBusy] = await p50s(0);
  const [idle, partIdle] = await p50s(2);
  return { busy, idle, partBusy, partIdle };
}

/**
 * What a durable commit costs on this PostgreSQL, in a database of its own: a bare one-row INSERT (a
 * prepared statement through `pg`), then the store's append of one event as a reservation makes it,
 * with its statement's time (the group commit's batch, told by the store's onAppend).
 */
async function commitFloor(url: string): Promise<string> {
  const db = await scratchDatabase(url, 'gw_floor');
  try {
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    let insert: Awaited<ReturnType<typeof backToBackAndIdle>>;
    try {
      await client.query('CREATE TABLE floor (id bigserial PRIMARY KEY, v text NOT NULL)');
      insert = await backToBackAndIdle(() => client.query({ name: 'floor', text: 'INSERT INTO floor (v) VALUES ($1)', values: ['x'] }));
    } finally {
      await client.end();
    }
    let statementMs = NaN;
    const store = await openEventStore({ databaseUrl: db.url, nestedCallCheck: false, onAppend: (ms) => (statementMs = ms) });
    try {
      const data = { request_id: randomUUID(), input_tokens: 5, output_tokens: 16, at: new Date().toISOString() };
      let version = 0;
      const append = async () => {
        version = (await store.append('floor-1', [{ id: randomUUID(), type: 'BudgetReserved', data }], version === 0 ? 'no_stream' : version)).nextExpectedVersion;
      };
      const appended = await backToBackAndIdle(append, () => statementMs);
      const f = (x: number) => x.toFixed(3);
      return (
        `the floor, p50 ms (a durable commit on this PostgreSQL; back to back / after 2 ms idle): a one-row INSERT through pg ${f(insert.busy)} / ${f(insert.idle)} | ` +
        `the store's append of one event ${f(appended.busy)} / ${f(appended.idle)}, of which its statement ${f(appended.partBusy)} / ${f(appended.partIdle)}`
      );
    } finally {
      await store.close();
    }
  } finally {
    await db.drop();
  }
}
