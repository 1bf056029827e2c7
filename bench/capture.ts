// Capture relay: the same residual-stream capture fetched straight from a stub activation engine that
// answers at once (test/support/capture-engine.ts, its own process), through the gateway (started as
// `npm start` starts it: bench/support.ts startScriptFlags), and through the floor, a bare node:http
// relay that holds the engine's body and answers with one `end()` (bench/bare-relay.ts), in one run.
// Two cases, each its own engine process and bare relay:
//   block  the engine writes its body in 256 KiB writes; the client is undici's `request` (no Accept-Encoding)
//   layer  the engine writes one layer (about 0.7 MB) per write; the client is `fetch`, which sends
//          `Accept-Encoding: gzip, deflate` (as Python's requests and httpx do)
// For the 11 MB capture, interleaved rounds (each target's turn after the gateway has finished any
// earlier request's work, in an order that turns each round): each target's median time, the gateway's speed relative to
// the holding relay (target >= 0.9) and the CPU per capture of every process in the run (gateway,
// relay, engine, client; PostgreSQL's server processes with DATABASE_URL); the gateway's also after
// each response until it is quiet (its settlement and projections), and while idle (its polling). Then the 610 MB capture's
// time both ways, and the gateway's RSS while relaying 4 concurrent 610 MB captures.
// Knobs: BENCH_PARTS, BENCH_CAPTURE_ROUNDS (below); BENCH_GATEWAY_FLAGS, node flags added after the start
// script's (so they override them: `--max-semi-space-size=16` gives back Node's default young generation);
// BENCH_PROF_DIR, CPU profiles of the gateway and the bare relays there; BENCH_KEEP, the run's directory
// (the gateway's log) kept.
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, cpus, totalmem, loadavg } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { buildGateway, gatewayEnv, gatewayServeArgs, startScriptFlags, issueKeys, median, memoryOf, postgresPids, scratchDatabase, spawnWithUrl, stop } from './support.ts';
import { captureRequest, engineCaptureBody, postHashed, stubModel, STUB_CHECKPOINT } from '../test/support/capture.ts';

type CaseName = 'block' | 'layer';
const cases: CaseName[] = ['block', 'layer'];
const dir = mkdtempSync(join(tmpdir(), 'svc-bench-capture-'));
const startedAt = new Date();
const loadAtStart = loadavg()[0];
const engines = {
  block: await spawnWithUrl(['--import', 'tsx', 'test/support/capture-engine.ts', STUB_CHECKPOINT], process.env),
  layer: await spawnWithUrl(['--import', 'tsx', 'test/support/capture-engine.ts', STUB_CHECKPOINT, 'layer'], process.env),
};
const profFlags = process.env.BENCH_PROF_DIR ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_PROF_DIR}`] : [];
const bares = {
  block: await spawnWithUrl([...profFlags, '--import', 'tsx', 'bench/bare-relay.ts', engines.block.url], process.env),
  layer: await spawnWithUrl([...profFlags, '--import', 'tsx', 'bench/bare-relay.ts', engines.layer.url], process.env),
};
// One model per engine: `stub` (the default) on the block engine, `stub-layer` on the layer engine.
writeFileSync(join(dir, 'models.json'), JSON.stringify({ models: [stubModel(engines.block.url), { ...stubModel(engines.layer.url), id: 'stub-layer', default: false }] }));
const modelOf: Record<CaseName, string> = { block: 'stub', layer: 'stub-layer' };
const storeKind = process.env.DATABASE_URL ? 'postgres' : 'pglite';
buildGateway();
// With DATABASE_URL the gateway gets a fresh PostgreSQL database of its own (dropped at the end).
const db = process.env.DATABASE_URL ? await scratchDatabase(process.env.DATABASE_URL, 'capture') : null;
const env = gatewayEnv(dir, 'data', db ? { DATABASE_URL: db.url } : {});
const gatewayLog = join(dir, 'gateway.log');
const extraFlags = (process.env.BENCH_GATEWAY_FLAGS ?? '').split(' ').filter(Boolean);
const gateway = await spawnWithUrl([...profFlags, ...startScriptFlags(), ...extraFlags, 'bin/start.js'], env, /listening on (http:\/\/\S+)/, gatewayLog);
// One key (metering on, the default): some 200 requests, at most 4 at once, well inside its limits.
const [apiKey] = await issueKeys(gateway.url, 1, 'capture');
const keyHeader = { authorization: `Bearer ${apiKey}` };
const dispatcher = new Agent({ connections: 8, keepAliveTimeout: 60_000 });

const small = captureRequest('whole', 129); // 16 x 129 x 2048: 11.3 MB
const large = captureRequest('whole', 6980); // 16 x 6,980 x 2048: 610 MB
type Target = { url: string; body: string; headers: Record<string, string> };
const direct = (c: CaseName, req: Record<string, unknown>): Target => ({ url: `${engines[c].url}/v1/completions`, body: engineCaptureBody(req), headers: {} });
const viaGateway = (c: CaseName, req: Record<string, unknown>): Target => ({ url: `${gateway.url}/v1/completions`, body: JSON.stringify({ ...req, model: modelOf[c] }), headers: keyHeader });
const viaBare = (c: CaseName, mode: 'pipe' | 'hold', req: Record<string, unknown>): Target => ({ url: `${bares[c].url}/${mode}/v1/completions`, body: engineCaptureBody(req), headers: {} });

/** CPU time a process's threads have run, in ms (threadCpuMsOf, all threads); 0 once it is gone. */
function cpuMsOf(pid: number): number {
  const { main, others } = threadCpuMsOf(pid);
  return main + others;
}
/**
 * A process's CPU ms so far on its main thread and on all its other threads (V8's garbage-collection and
 * compiler workers, libuv's pool), from schedstat (nanoseconds, where /proc's stat counts 10 ms ticks): a
 * gateway whose old generation is marked again and again shows it there. Zeros once it is gone.
 */
function threadCpuMsOf(pid: number): { main: number; others: number } {
  const split = { main: 0, others: 0 };
  let tasks: string[] = [];
  try {
    tasks = readdirSync(`/proc/${pid}/task`);
  } catch {
    /* gone */
  }
  for (const task of tasks) {
    try {
      const ms = Number(readFileSync(`/proc/${pid}/task/${task}/schedstat`, 'utf8').split(' ')[0]) / 1e6;
      split[Number(task) === pid ? 'main' : 'others'] += ms;
    } catch {
      /* a thread that ended meanwhile */
    }
  }
  return split;
}
const clientCpuMs = () => {
  const { user, system } = process.cpuUsage();
  return (user + system) / 1000;
};

/** The response's Content-Encoding as the client saw it (`fetch` decodes gzip itself and drops nothing of the header). */
const gatewayEncoding: Record<CaseName, string> = { block: 'none', layer: 'none' };

/** Milliseconds from sending to the last byte read (bytes counted, not kept or hashed), with undici's request or with fetch. */
async function timeOne(c: CaseName, target: Target): Promise<{ ms: number; bytes: number; encoding: string }> {
  const started = performance.now();
  let bytes = 0;
  if (c === 'block') {
    const res = await request(target.url, { method: 'POST', body: target.body, headers: { 'content-type': 'application/json', ...target.headers }, dispatcher });
    for await (const chunk of res.body) bytes += (chunk as Buffer).length;
    if (res.statusCode !== 200) throw new Error(`${target.url}: status ${res.statusCode}`);
    return { ms: performance.now() - started, bytes, encoding: String(res.headers['content-encoding'] ?? 'identity') };
  }
  const res = await fetch(target.url, { method: 'POST', body: target.body, headers: { 'content-type': 'application/json', ...target.headers } });
  const reader = res.body!.getReader();
  for (let next = await reader.read(); !next.done; next = await reader.read()) bytes += next.value.length;
  if (res.status !== 200) throw new Error(`${target.url}: status ${res.status}`);
  return { ms: performance.now() - started, bytes, encoding: res.headers.get('content-encoding') ?? 'identity' };
}

// BENCH_PARTS=small,large,memory picks parts (all by default); BENCH_CAPTURE_ROUNDS sets the 11 MB rounds (40).
const parts = new Set((process.env.BENCH_PARTS ?? 'memory,small,large').split(','));

// Byte-identical first (hashed while streaming), outside the timings.
for (const c of cases) {
  const [a, b] = [await postHashed(direct(c, small).url, direct(c, small).body), await postHashed(viaGateway(c, small).url, viaGateway(c, small).body, undefined, keyHeader)];
  if (a.sha256 !== b.sha256 || b.status !== 200) throw new Error(`the 11 MB capture (${c}) is not byte-identical through the gateway`);
}

// 4 concurrent 610 MB captures first, on the fresh gateway, so its baseline is not memory the allocator
// kept from earlier relays: the gateway's RSS sampled every 20 ms.
const beforeMb = memoryOf(gateway.child.pid!).rssMb;
let peakMb = beforeMb;
const sampler = setInterval(() => (peakMb = Math.max(peakMb, memoryOf(gateway.child.pid!).rssMb)), 20);
const concurrentStarted = performance.now();
const concurrent = parts.has('memory') ? await Promise.all(Array.from({ length: 4 }, () => timeOne('block', viaGateway('block', large)))) : [];
const concurrentMs = performance.now() - concurrentStarted;
clearInterval(sampler);
peakMb = Math.max(peakMb, memoryOf(gateway.child.pid!).rssMb);
const inFlightMb = concurrent.reduce((s, r) => s + r.bytes, 0) / 1e6;

// 11 MB: interleaved rounds after a warm-up, so machine noise hits every target alike.
type Via = 'direct' | 'gateway' | 'hold' | 'pipe';
const vias: Via[] = ['direct', 'gateway', 'hold', 'pipe'];
const targetOf = (c: CaseName, via: Via, req: Record<string, unknown>): Target => (via === 'direct' ? direct(c, req) : via === 'gateway' ? viaGateway(c, req) : viaBare(c, via, req));
/** The processes a request to `via` runs through, besides the client. */
const pidsOf = (c: CaseName, via: Via): Record<string, number> => ({
  ...(via === 'gateway' ? { gateway: gateway.child.pid! } : via === 'direct' ? {} : { relay: bares[c].child.pid! }),
  engine: engines[c].child.pid!,
});
for (let i = 0; i < (parts.has('small') ? 10 : 0); i++) for (const c of cases) for (const via of vias) await timeOne(c, targetOf(c, via, small));
const rounds = Number(process.env.BENCH_CAPTURE_ROUNDS ?? 40);
const times = Object.fromEntries(cases.map((c) => [c, Object.fromEntries(vias.map((v) => [v, [] as number[]]))])) as Record<CaseName, Record<Via, number[]>>;
/** CPU ms per process, summed over each target's requests (during them). */
const cpu = Object.fromEntries(cases.map((c) => [c, Object.fromEntries(vias.map((v) => [v, {} as Record<string, number>]))])) as Record<CaseName, Record<Via, Record<string, number>>>;
let smallBytes = 0;
/**
 * The gateway's CPU per second while it serves nothing (its processors' and store's polling), over 2 s
 * once it is quiet: counted in its CPU over the rounds, taken out of its CPU after each response.
 */
let idleMsPerS = 0;
if (parts.has('small')) {
  await gatewaySettled();
  const [cpuBefore, at] = [cpuMsOf(gateway.child.pid!), performance.now()];
  await new Promise((resolve) => setTimeout(resolve, 2000));
  idleMsPerS = (cpuMsOf(gateway.child.pid!) - cpuBefore) / ((performance.now() - at) / 1000);
}
// The gateway's CPU over the whole rounds too: its settlement and projections run after a response,
// during the other targets' turns. And PostgreSQL's (every server process on this machine: noisy on a shared one).
const pg = postgresPids();
const pgBefore = new Map(pg.map((pid) => [pid, cpuMsOf(pid)]));
/** PostgreSQL's CPU since the rounds began (a server process that ended meanwhile counts nothing). */
const pgCpuMs = () => pg.reduce((sum, pid) => sum + Math.max(0, cpuMsOf(pid) - pgBefore.get(pid)!), 0);
const gatewayRoundsBefore = cpuMsOf(gateway.child.pid!);
/**
 * Waits (at most 300 ms) until the gateway has stopped working on an earlier request (its CPU moved less
 * than 0.3 ms in 10 ms): its settlement and projections run after a response, and would otherwise land
 * on whichever target comes next. They are counted in its CPU over the rounds.
 */
async function gatewaySettled(): Promise<void> {
  for (const until = performance.now() + 300; performance.now() < until; ) {
    const before = cpuMsOf(gateway.child.pid!);
    await new Promise((resolve) => setTimeout(resolve, 10));
    if (cpuMsOf(gateway.child.pid!) - before < 0.3) return;
  }
}
const threadPids = { gateway: gateway.child.pid!, 'block relay': bares.block.child.pid!, 'layer relay': bares.layer.child.pid! };
const threadsBefore = Object.fromEntries(Object.entries(threadPids).map(([name, pid]) => [name, threadCpuMsOf(pid)]));
const roundsStarted = performance.now();
for (let i = 0; i < (parts.has('small') ? rounds : 0); i++) {
  for (const c of cases) {
    // Each round in another order, so no target always follows the same one.
    for (const via of [...vias.slice(i % vias.length), ...vias.slice(0, i % vias.length)]) {
      await gatewaySettled();
      const pids = pidsOf(c, via);
      const before = Object.fromEntries(Object.entries(pids).map(([name, pid]) => [name, cpuMsOf(pid)]));
      const clientBefore = clientCpuMs();
      const r = await timeOne(c, targetOf(c, via, small));
      const into = cpu[c][via];
      into.client = (into.client ?? 0) + clientCpuMs() - clientBefore;
      for (const [name, pid] of Object.entries(pids)) into[name] = (into[name] ?? 0) + cpuMsOf(pid) - before[name];
      times[c][via].push(r.ms);
      if (via === 'gateway') gatewayEncoding[c] = r.encoding;
      smallBytes = r.bytes;
    }
  }
}
/** Main thread and other threads' CPU over the rounds: the gateway's per capture through it, the relays' per request (holding and streaming). */
const threadSplit = Object.fromEntries(
  Object.entries(threadPids).map(([name, pid]) => {
    const [after, before] = [threadCpuMsOf(pid), threadsBefore[name]];
    const requests = name === 'gateway' ? rounds * cases.length : rounds * 2;
    return [name, { main: (after.main - before.main) / requests, others: (after.others - before.others) / requests }];
  }),
);
const gatewayRoundsCpuMs = (cpuMsOf(gateway.child.pid!) - gatewayRoundsBefore) / (rounds * cases.length);
/** The gateway's idle polling over the rounds, per capture through it. */
const idlePerCaptureMs = (idleMsPerS * (performance.now() - roundsStarted)) / 1000 / (rounds * cases.length);
const pgRoundsCpuMs = pgCpuMs() / (rounds * cases.length);
// The gateway's CPU after a response until it is quiet (settlement, projections), less its idle polling
// meanwhile: measured on requests of its own after the timed rounds, since waiting it out right after each
// timed response changed the rounds' pace and slowed the gateway's next responses.
for (let i = 0; i < (parts.has('small') ? rounds : 0); i++) {
  for (const c of cases) {
    await gatewaySettled();
    await timeOne(c, targetOf(c, 'gateway', small));
    const [cpuBefore, at] = [cpuMsOf(gateway.child.pid!), performance.now()];
    await gatewaySettled();
    cpu[c].gateway['gateway after'] = (cpu[c].gateway['gateway after'] ?? 0) + cpuMsOf(gateway.child.pid!) - cpuBefore - (idleMsPerS * (performance.now() - at)) / 1000;
  }
}

// 610 MB: twice each way, interleaved (the block case).
const largeTimes = { direct: [] as number[], gateway: [] as number[], hold: [] as number[] };
/** CPU seconds per GB relayed, per process, summed over each target's 610 MB requests. */
const largeCpu = { direct: {} as Record<string, number>, gateway: {} as Record<string, number>, hold: {} as Record<string, number> };
let largeBytes = 0;
for (let i = 0; i < (parts.has('large') ? 2 : 0); i++) {
  for (const via of ['direct', 'gateway', 'hold'] as const) {
    await gatewaySettled();
    const pids = pidsOf('block', via);
    const before = Object.fromEntries(Object.entries(pids).map(([name, pid]) => [name, cpuMsOf(pid)]));
    const clientBefore = clientCpuMs();
    const r = await timeOne('block', targetOf('block', via, large));
    const into = largeCpu[via];
    into.client = (into.client ?? 0) + (clientCpuMs() - clientBefore) / 1000 / (r.bytes / 1e9);
    for (const [name, pid] of Object.entries(pids)) into[name] = (into[name] ?? 0) + (cpuMsOf(pid) - before[name]) / 1000 / (r.bytes / 1e9);
    largeTimes[via].push(r.ms);
    largeBytes = r.bytes;
  }
}
const largeCpuLine = (via: keyof typeof largeCpu) =>
  Object.entries(largeCpu[via])
    .map(([name, total]) => `${name} ${(total / largeTimes[via].length).toFixed(2)}`)
    .join(', ');

const mb = (bytes: number) => (bytes / 1e6).toFixed(1);
const ms = (x: number) => x.toFixed(1);
const describe: Record<CaseName, string> = {
  block: 'engine writes 256 KiB per write, client undici request (no Accept-Encoding)',
  layer: 'engine writes one layer (0.7 MB) per write, client fetch (Accept-Encoding: gzip, deflate)',
};
const cpuLine = (c: CaseName, via: Via) =>
  Object.entries(cpu[c][via])
    .map(([name, total]) => `${name} ${ms(total / rounds)}`)
    .join(', ');
const lines = [
  `capture relay bench (store: ${storeKind}; gateway started as npm start: node ${gatewayServeArgs().join(' ')}${extraFlags.length ? `, with ${extraFlags.join(' ')} after its flags` : ''}, default settings, log to a file) — ${startedAt.toISOString()} to ${new Date().toISOString()} — ${cpus().length} cores (${cpus()[0]?.model}), ${Math.round(totalmem() / 2 ** 30)} GiB, Node ${process.version}, load average ${loadAtStart.toFixed(1)} at start, ${loadavg()[0].toFixed(1)} at end`,
  ...(parts.has('small')
    ? cases.flatMap((c) => {
        const t = times[c];
        return [
          `11 MB capture (${mb(smallBytes)} MB, 16 x 129 x 2048 bf16), ${describe[c]}; median of ${rounds} interleaved rounds:`,
          `  direct ${ms(median(t.direct))} ms | bare holding relay ${ms(median(t.hold))} ms | bare streaming relay ${ms(median(t.pipe))} ms | gateway ${ms(median(t.gateway))} ms (Content-Encoding: ${gatewayEncoding[c]})`,
          `  gateway / bare holding relay: ${(median(t.hold) / median(t.gateway)).toFixed(2)} of its speed (target >= 0.9); gateway ${(median(t.direct) / median(t.gateway)).toFixed(2)} of direct, holding relay ${(median(t.direct) / median(t.hold)).toFixed(2)} of direct`,
          `  CPU ms per capture, during each request (all threads): direct: ${cpuLine(c, 'direct')} | holding relay: ${cpuLine(c, 'hold')} | streaming relay: ${cpuLine(c, 'pipe')} | gateway: ${cpuLine(c, 'gateway')}`,
        ];
      })
    : []),
  ...(parts.has('small') ? [`  gateway CPU per capture over the whole rounds: ${ms(gatewayRoundsCpuMs)} ms (during the response, then after it until quiet: settlement and projections, as above; the rest is its idle polling, ${ms(idleMsPerS)} ms per second: ${ms(idlePerCaptureMs)} ms per capture over the rounds, and the other targets' turns); PostgreSQL's server processes (this machine's, others' work included): ${pg.length ? `${ms(pgRoundsCpuMs)} ms` : 'n/a'}`] : []),
  ...(parts.has('small')
    ? [
        `  CPU ms over the rounds by thread, main thread + the others (V8's garbage-collection and compiler workers, libuv's pool): ${Object.entries(threadSplit)
          .map(([name, t]) => `${name} ${ms(t.main)} + ${ms(t.others)}`)
          .join(', ')} (the gateway's per capture through it, idle polling and settlement included; each relay's per request, holding and streaming)`,
      ]
    : []),
  ...(parts.has('large') ? [`610 MB capture (${mb(largeBytes)} MB, 16 x 6,980 x 2048 bf16), block case: direct ${largeTimes.direct.map((x) => (x / 1000).toFixed(2)).join(', ')} s | gateway ${largeTimes.gateway.map((x) => (x / 1000).toFixed(2)).join(', ')} s | bare holding relay ${largeTimes.hold.map((x) => (x / 1000).toFixed(2)).join(', ')} s: the gateway at ${(median(largeTimes.hold) / median(largeTimes.gateway)).toFixed(2)} of its speed`,
  `  CPU seconds per GB, during each request: direct: ${largeCpuLine('direct')} | holding relay: ${largeCpuLine('hold')} | gateway: ${largeCpuLine('gateway')}`] : []),
  ...(parts.has('memory') ? [`4 concurrent 610 MB captures through the gateway: ${(concurrentMs / 1000).toFixed(1)} s; gateway RSS ${beforeMb.toFixed(0)} MB before, peak ${peakMb.toFixed(0)} MB; bodies in flight ${inFlightMb.toFixed(0)} MB, so the bound (bodies + 200 MB) is ${(inFlightMb + 200).toFixed(0)} MB: ${peakMb <= inFlightMb + 200 ? 'met' : 'NOT met'} (peak - before = ${(peakMb - beforeMb).toFixed(0)} MB)`] : []),
];
process.stdout.write(`${lines.join('\n')}\n`);

await dispatcher.close();
await stop(gateway.child);
for (const c of cases) {
  await stop(bares[c].child);
  await stop(engines[c].child);
}
await db?.drop();
if (process.env.BENCH_KEEP) process.stderr.write(`kept ${dir}\n`);
else rmSync(dir, { recursive: true, force: true });
