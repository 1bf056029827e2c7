// Capture relay: the same residual-stream capture fetched straight from a stub activation engine that
// answers at once (test/support/capture-engine.ts, its own process) and through the compiled gateway, in
// one run. Prints the 11 MB capture's time both ways (interleaved rounds) and their ratio, beside two
// bare Node.js relays for scale (bench/bare-relay.ts), the 610 MB capture's time both ways, and the
// gateway's RSS while relaying 4 concurrent 610 MB captures.
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir, cpus, totalmem } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { buildGateway, gatewayEnv, gatewayServeArgs, issueKeys, median, memoryOf, scratchDatabase, spawnWithUrl, stop } from './support.ts';
import { captureRequest, engineCaptureBody, postHashed, stubModel, STUB_CHECKPOINT } from '../test/support/capture.ts';

const dir = mkdtempSync(join(tmpdir(), 'svc-bench-capture-'));
const engine = await spawnWithUrl(['--import', 'tsx', 'test/support/capture-engine.ts', STUB_CHECKPOINT], process.env);
// For scale: bare relays in their own process (bench/bare-relay.ts), streaming and holding the body.
const bare = await spawnWithUrl(['--import', 'tsx', 'bench/bare-relay.ts', engine.url], process.env);
writeFileSync(join(dir, 'models.json'), JSON.stringify({ models: [stubModel(engine.url)] }));
const storeKind = process.env.DATABASE_URL ? 'postgres' : 'pglite';
buildGateway();
// With DATABASE_URL the gateway gets a fresh PostgreSQL database of its own (dropped at the end).
const db = process.env.DATABASE_URL ? await scratchDatabase(process.env.DATABASE_URL, 'capture') : null;
const env = gatewayEnv(dir, 'data', db ? { DATABASE_URL: db.url } : {});
const gateway = await spawnWithUrl(gatewayServeArgs(process.env.BENCH_PROF_DIR ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_PROF_DIR}`] : []), env, /listening on (http:\/\/\S+)/);
// One key (metering on, the default): some 60 requests, at most 4 at once, well inside its limits.
const [apiKey] = await issueKeys(gateway.url, 1, 'capture');
const keyHeader = { authorization: `Bearer ${apiKey}` };
const dispatcher = new Agent({ connections: 8, keepAliveTimeout: 60_000 });

const small = captureRequest('whole', 129); // 16 x 129 x 2048: 11.3 MB
const large = captureRequest('whole', 6980); // 16 x 6,980 x 2048: 610 MB
const direct = (req: Record<string, unknown>) => ({ url: `${engine.url}/v1/completions`, body: engineCaptureBody(req), headers: {} });
const viaGateway = (req: Record<string, unknown>) => ({ url: `${gateway.url}/v1/completions`, body: JSON.stringify(req), headers: keyHeader });
const viaBare = (mode: 'pipe' | 'buffer') => (req: Record<string, unknown>) => ({ url: `${bare.url}/${mode}/v1/completions`, body: engineCaptureBody(req), headers: {} });

/** CPU time a process's threads have run, in ms (from schedstat: nanoseconds, where /proc's stat counts 10 ms ticks). */
function cpuMsOf(pid: number): number {
  let ns = 0;
  for (const task of readdirSync(`/proc/${pid}/task`)) {
    try {
      ns += Number(readFileSync(`/proc/${pid}/task/${task}/schedstat`, 'utf8').split(' ')[0]);
    } catch {
      /* a thread that ended meanwhile */
    }
  }
  return ns / 1e6;
}

/** Milliseconds from sending to the last byte read (bytes counted, not kept or hashed). */
async function timeOne(target: { url: string; body: string; headers: Record<string, string> }): Promise<{ ms: number; bytes: number }> {
  const started = performance.now();
  const res = await request(target.url, { method: 'POST', body: target.body, headers: { 'content-type': 'application/json', ...target.headers }, dispatcher });
  let bytes = 0;
  for await (const chunk of res.body) bytes += (chunk as Buffer).length;
  if (res.statusCode !== 200) throw new Error(`${target.url}: status ${res.statusCode}`);
  return { ms: performance.now() - started, bytes };
}

// BENCH_PARTS=memory,small,large picks parts (all by default); BENCH_CAPTURE_ROUNDS sets the 11 MB rounds (40).
const parts = new Set((process.env.BENCH_PARTS ?? 'memory,small,large').split(','));

// Byte-identical first (hashed while streaming), outside the timings.
const [a, b] = [await postHashed(direct(small).url, direct(small).body), await postHashed(viaGateway(small).url, viaGateway(small).body, undefined, keyHeader)];
if (a.sha256 !== b.sha256 || b.status !== 200) throw new Error('the 11 MB capture is not byte-identical through the gateway');

// 4 concurrent 610 MB captures first, on the fresh gateway, so its baseline is not memory the allocator
// kept from earlier relays: the gateway's RSS sampled every 20 ms.
const beforeMb = memoryOf(gateway.child.pid!).rssMb;
let peakMb = beforeMb;
const sampler = setInterval(() => (peakMb = Math.max(peakMb, memoryOf(gateway.child.pid!).rssMb)), 20);
const concurrentStarted = performance.now();
const concurrent = parts.has('memory') ? await Promise.all(Array.from({ length: 4 }, () => timeOne(viaGateway(large)))) : [];
const concurrentMs = performance.now() - concurrentStarted;
clearInterval(sampler);
peakMb = Math.max(peakMb, memoryOf(gateway.child.pid!).rssMb);
const inFlightMb = concurrent.reduce((s, r) => s + r.bytes, 0) / 1e6;

// 11 MB: interleaved rounds after a warm-up, so machine noise hits both alike.
for (let i = 0; i < (parts.has('small') ? 10 : 0); i++) {
  await timeOne(direct(small));
  await timeOne(viaGateway(small));
  await timeOne(viaBare('pipe')(small));
  await timeOne(viaBare('buffer')(small));
}
const rounds = Number(process.env.BENCH_CAPTURE_ROUNDS ?? 40);
const smallDirect: number[] = [];
const smallGateway: number[] = [];
const smallPipe: number[] = [];
const smallBuffer: number[] = [];
let smallBytes = 0;
// CPU per capture, which a busy machine skews less than wall time: each relay's around its own requests,
// and the gateway's over the whole rounds too (its settlement and projections run after a response,
// during the other relays' turns).
const gatewayCpuBefore = cpuMsOf(gateway.child.pid!);
let gatewayCpu = 0;
let bareBufferCpu = 0;
for (let i = 0; i < (parts.has('small') ? rounds : 0); i++) {
  const d = await timeOne(direct(small));
  smallDirect.push(d.ms);
  const gatewayBefore = cpuMsOf(gateway.child.pid!);
  smallGateway.push((await timeOne(viaGateway(small))).ms);
  gatewayCpu += cpuMsOf(gateway.child.pid!) - gatewayBefore;
  smallPipe.push((await timeOne(viaBare('pipe')(small))).ms);
  const bareBefore = cpuMsOf(bare.child.pid!);
  smallBuffer.push((await timeOne(viaBare('buffer')(small))).ms);
  bareBufferCpu += cpuMsOf(bare.child.pid!) - bareBefore;
  smallBytes = d.bytes;
}
const gatewayRoundsCpuMs = (cpuMsOf(gateway.child.pid!) - gatewayCpuBefore) / rounds;

// 610 MB: twice each way, interleaved.
const largeDirect: number[] = [];
const largeGateway: number[] = [];
const largeBuffer: number[] = [];
let largeBytes = 0;
for (let i = 0; i < (parts.has('large') ? 2 : 0); i++) {
  const d = await timeOne(direct(large));
  largeDirect.push(d.ms);
  largeBytes = d.bytes;
  largeGateway.push((await timeOne(viaGateway(large))).ms);
  largeBuffer.push((await timeOne(viaBare('buffer')(large))).ms);
}

const mb = (bytes: number) => (bytes / 1e6).toFixed(1);
const ms = (x: number) => x.toFixed(1);
const lines = [
  `capture relay bench (store: ${storeKind}) — ${new Date().toISOString()} — ${cpus().length} cores (${cpus()[0]?.model}), ${Math.round(totalmem() / 2 ** 30)} GiB, Node ${process.version}`,
  ...(parts.has('small') ? [`11 MB capture (${mb(smallBytes)} MB, 16 x 129 x 2048 bf16), median of ${rounds} interleaved: direct ${ms(median(smallDirect))} ms | gateway ${ms(median(smallGateway))} ms | gateway speed ${(median(smallDirect) / median(smallGateway)).toFixed(2)} of direct (target >= 0.8)`,
  `  bare Node.js relays in their own process, same rounds: streaming ${ms(median(smallPipe))} ms (${(median(smallDirect) / median(smallPipe)).toFixed(2)} of direct), holding the body ${ms(median(smallBuffer))} ms (${(median(smallDirect) / median(smallBuffer)).toFixed(2)} of direct); the gateway, with a key, at ${(median(smallBuffer) / median(smallGateway)).toFixed(2)} of the holding relay's speed (target >= 0.9)`,
  `  CPU per 11 MB capture (all threads): gateway ${ms(gatewayCpu / rounds)} ms during its requests, ${ms(gatewayRoundsCpuMs)} ms with what it does after them (settlement, projections) | bare holding relay ${ms(bareBufferCpu / rounds)} ms during its requests`] : []),
  ...(parts.has('large') ? [`610 MB capture (${mb(largeBytes)} MB, 16 x 6,980 x 2048 bf16): direct ${largeDirect.map((x) => (x / 1000).toFixed(2)).join(', ')} s | gateway ${largeGateway.map((x) => (x / 1000).toFixed(2)).join(', ')} s | bare holding relay ${largeBuffer.map((x) => (x / 1000).toFixed(2)).join(', ')} s: the gateway at ${(median(largeBuffer) / median(largeGateway)).toFixed(2)} of its speed`] : []),
  ...(parts.has('memory') ? [`4 concurrent 610 MB captures through the gateway: ${(concurrentMs / 1000).toFixed(1)} s; gateway RSS ${beforeMb.toFixed(0)} MB before, peak ${peakMb.toFixed(0)} MB; bodies in flight ${inFlightMb.toFixed(0)} MB, so the bound (bodies + 200 MB) is ${(inFlightMb + 200).toFixed(0)} MB: ${peakMb <= inFlightMb + 200 ? 'met' : 'NOT met'} (peak - before = ${(peakMb - beforeMb).toFixed(0)} MB)`] : []),
];
process.stdout.write(`${lines.join('\n')}\n`);

await dispatcher.close();
await stop(gateway.child);
await stop(bare.child);
await stop(engine.child);
await db?.drop();
rmSync(dir, { recursive: true, force: true });
