/**
 * The harvest data plane against its floors, in one run:
 * 1. A harvest as users run it: `svc serve` and a `svc worker` (with DATABASE_URL: the PostgreSQL transport,
 *    each in its own process; without: the embedded store, the worker in the gateway's process) and a stub
 *    engine answering every capture at once (test/support/capture-engine.ts `random`, its own process), on the same cores.
 *    Each process's CPU seconds per GB of shard written (/proc: every thread), the worker's split by thread
 *    (main; the others' user and sys), and the harvest's GB/s beside a raw write + fsync of the same files'
 *    bytes to the same disk, rounds interleaved.
 * 2. The worker's parts, each alone on the same bytes in this process (CPU per GB of shard bytes, all
 *    threads, a batch of captures in flight): receive (the worker's reader, stream-post.ts: one reused
 *    buffer per connection; undici's beside it), decode (scan + base64 into place), receive + decode as the
 *    worker runs them (each piece decoded as it is read) and through undici (each chunk decoded as it
 *    arrives, or each body collected whole, then decoded), convert (float32
 *    captures rounded to bf16), write, hash, stats; each beside its floor on this machine (a bare node:http
 *    read, Node's native base64 decoder, a raw O_DIRECT write + fsync, OpenSSL's SHA-256 through node:crypto) and
 *    how far above it. Write and hash run interleaved with their floors, round after round (BENCH_HARVEST_
 *    IO_ROUNDS, 5), each figure the least-CPU round with its user and sys: the shard sink (writes,
 *    writeback, commit), the hash alone (the sink's read-back of the same files), a raw write + fsync
 *    through the page cache and one with O_DIRECT (the sink's writes from captures' buffers placed as the
 *    worker places them, and from bytes elsewhere, staged),
 *    OpenSSL's SHA-256 over a buffer in cache and over the captures' own (32 MiB) buffers.
 * 3. The in-process pipeline (decode + write + hash + stats, no HTTP) with the statistics on and off, and with
 *    the captures not placed for direct writes (every whole block staged), interleaved: CPU of every thread
 *    and of the main thread alone (where the statistics and the staging copies run; far less noisy).
 *   node --import tsx bench/harvest.ts     (npm run bench -- harvest)
 * Shape by environment: BENCH_HARVEST_PROMPTS (48), _TOKENS (512), _SHARD (8 prompts), _BATCH (4),
 * _ROUNDS (2); 16 layers x 2048 wide. BENCH_HARVEST_DIR (default .bench/ in the repository, on the disk
 * DATA_DIR defaults to). BENCH_PROF_DIR: the worker runs under --cpu-prof, its profiles written there.
 */
import { Buffer } from 'node:buffer';
import { createHash } from 'node:crypto';
import { constants, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { open } from 'node:fs/promises';
import { cpus, loadavg, totalmem } from 'node:os';
import { join } from 'node:path';
import { request as httpRequest, Agent as HttpAgent } from 'node:http';
import { Pool } from 'undici';
import { CaptureBuffers, CaptureReader, decodeCapture } from '../src/harvest/capture-decode.ts';
import { fileHarvestStorage, shardFileName } from '../src/harvest/storage.ts';
import { hashFile } from '../src/harvest/file-hasher.ts';
import { captureOffsets, runShardPipeline, type CapturedPrompt } from '../src/harvest/shard-pipeline.ts';
import { RunningStats } from '../src/harvest/stats.ts';
import { StreamPoster } from '../src/engine-client/stream-post.ts';
import { fixedMemory } from '../src/harvest/wasm-asm.ts';
import { buildGateway, cpuSecondsOf, issueKeys, postgresPids, root, scratchDatabase, spawnWithUrl, stop, benchAdminToken } from './support.ts';
import { stubModel, STUB_CHECKPOINT, STUB_D_MODEL, STUB_LAYERS } from '../test/support/capture.ts';

const setting = (name: string, fallback: number) => Number(process.env[`BENCH_HARVEST_${name}`] ?? fallback);
const prompts = setting('PROMPTS', 48);
const tokens = setting('TOKENS', 512);
const shardSize = setting('SHARD', 8);
const batchSize = setting('BATCH', 4);
const rounds = setting('ROUNDS', 2);
const layers = STUB_LAYERS;
const dModel = STUB_D_MODEL;
const dir = join(process.env.BENCH_HARVEST_DIR ?? join(root, '.bench'), `harvest-${process.pid}`);
mkdirSync(dir, { recursive: true });
process.once('exit', () => rmSync(dir, { recursive: true, force: true }));
const promptBytes = layers * tokens * dModel * 2;
const gb = (bytes: number) => bytes / 1e9;
const loadBefore = loadavg()[0];
const out: string[] = [];
const print = (line = '') => {
  out.push(line);
  process.stderr.write(`${line}\n`);
};

// ---- 1. A harvest through the processes users run ----

const engine = await spawnWithUrl(['--import', 'tsx', 'test/support/capture-engine.ts', STUB_CHECKPOINT, 'random', `d_model=${dModel}`, `n_layers=${layers}`], process.env);
writeFileSync(join(dir, 'models.json'), JSON.stringify({ models: [stubModel(engine.url)] }));
buildGateway();
const db = process.env.DATABASE_URL ? await scratchDatabase(process.env.DATABASE_URL, 'harvest_bench') : null;
const harvestDir = join(dir, 'harvest');
const env = (name: string): NodeJS.ProcessEnv => ({
  ...process.env,
  SVC_CONFIG: join(dir, 'models.json'),
  DATA_DIR: join(dir, `data-${name}`),
  SVC_HARVEST_DIR: harvestDir,
  PORT: '0',
  LOG_LEVEL: 'warn',
  SVC_ADMIN_TOKEN: benchAdminToken,
  DATABASE_URL: db?.url ?? '',
  ...(db ? { SVC_HARVEST_TRANSPORT: 'postgres' } : {}),
});
const prof = process.env.BENCH_PROF_DIR ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_PROF_DIR}`] : [];
const svc = join(root, 'bin', 'svc.js');
const gateway = await spawnWithUrl([...(db ? [] : prof), svc, 'serve', ...(db ? ['--no-workers'] : [])], env('gateway'), /listening on (http:\/\/\S+)/);
const worker = db ? await spawnWithUrl([...prof, svc, 'worker'], env('worker'), /(svc worker) working on harvest jobs/) : gateway;
const [apiKey] = await issueKeys(gateway.url, 1, 'harvest');
const auth = { authorization: `Bearer ${apiKey}`, 'content-type': 'application/json' };

interface JobRun {
  seconds: number;
  bytes: number;
  files: number[];
  cpu: Record<string, number>;
  /** The worker's CPU seconds by thread: main (user, sys), the others (user, sys). */
  threads: number[];
}

/** A process's CPU seconds: its main thread's user and sys, and the rest of its threads' (live or ended). */
function threadSplit(pid: number): number[] {
  const fields = (path: string) => readFileSync(path, 'utf8').split(') ')[1].split(' ');
  const all = fields(`/proc/${pid}/stat`);
  const main = fields(`/proc/${pid}/task/${pid}/stat`);
  const [mu, ms, au, as] = [main[11], main[12], all[11], all[12]].map((x) => Number(x) / 100);
  return [mu, ms, au - mu, as - ms];
}

async function api(path: string, init: RequestInit = {}): Promise<any> {
  const res = await fetch(`${gateway.url}${path}`, { ...init, headers: { ...auth, ...(init.headers ?? {}) } });
  const body = await res.json();
  if (!res.ok) throw new Error(`${path}: ${res.status} ${JSON.stringify(body)}`);
  return body;
}

const pgPids = db ? postgresPids() : [];
const cpuOf = (pids: number[]) => pids.reduce((n, pid) => n + cpuSecondsOf(pid), 0);

/** One job of `prompts` prompts, submit to success; each process's CPU over it. */
async function harvestJob(): Promise<JobRun> {
  const procs: Record<string, number[]> = { worker: [worker.child.pid!], ...(db ? { gateway: [gateway.child.pid!] } : {}), engine: [engine.child.pid!], ...(db ? { postgres: pgPids } : {}) };
  const before = Object.fromEntries(Object.entries(procs).map(([k, pids]) => [k, cpuOf(pids)]));
  const threadsBefore = threadSplit(worker.child.pid!);
  const started = performance.now();
  let job = await api('/v1/harvest', { method: 'POST', body: JSON.stringify({ model: 'stub', prompts: Array.from({ length: prompts }, (_, i) => `${i}`.padEnd(tokens - 1, 'x')), layers: 'all', shard_size: shardSize, batch_size: batchSize }) });
  while (job.status === 'pending' || job.status === 'running') job = await api(`/v1/harvest/${job.id}?wait=30`);
  const seconds = (performance.now() - started) / 1000;
  const cpu = Object.fromEntries(Object.entries(procs).map(([k, pids]) => [k, cpuOf(pids) - before[k]]));
  const threads = threadSplit(worker.child.pid!).map((x, i) => x - threadsBefore[i]);
  if (job.status !== 'succeeded') throw new Error(`the harvest ${job.status}: ${JSON.stringify(job.error)}`);
  const files = job.result.shards.map((s: { bytes: number }) => s.bytes);
  return { seconds, bytes: files.reduce((a: number, b: number) => a + b, 0), files, cpu, threads };
}

/** The floor: the same files' sizes written from memory in prompt-sized writes, each file fsynced. */
const block = Buffer.alloc(promptBytes + tokens * 4, 0x5a);
async function rawWrite(files: number[], into: string): Promise<{ seconds: number; bytes: number; cpu: number }> {
  mkdirSync(into, { recursive: true });
  const cpu = process.cpuUsage();
  const started = performance.now();
  let total = 0;
  for (const [i, size] of files.entries()) {
    const handle = await open(join(into, `raw-${i}`), 'wx');
    for (let at = 0; at < size; at += block.length) await handle.write(block, 0, Math.min(block.length, size - at), at);
    await handle.sync();
    await handle.close();
    total += size;
  }
  const seconds = (performance.now() - started) / 1000;
  const used = process.cpuUsage(cpu);
  rmSync(into, { recursive: true, force: true });
  return { seconds, bytes: total, cpu: (used.user + used.system) / 1e6 };
}

const jobs: JobRun[] = [];
const raws: Awaited<ReturnType<typeof rawWrite>>[] = [];
for (let round = 0; round < rounds; round++) {
  const run = await harvestJob();
  jobs.push(run);
  rmSync(harvestDir, { recursive: true, force: true });
  raws.push(await rawWrite(run.files, join(dir, 'raw')));
}
const workerPid = worker.child.pid!;
await stop(worker.child);
if (worker !== gateway) await stop(gateway.child);
await db?.drop();

// ---- 2. The parts, each alone on the same bytes ----

type Part = { cpu: number; seconds: number; bytes: number };
/** CPU (this process, every thread) and wall time of `work`, which returns the shard bytes it stands for. */
async function measure(work: () => Promise<number> | number): Promise<Part> {
  const cpu = process.cpuUsage();
  const started = performance.now();
  const bytes = await work();
  const used = process.cpuUsage(cpu);
  return { cpu: (used.user + used.system) / 1e6, seconds: (performance.now() - started) / 1000, bytes };
}
const perGb = (p: Part) => p.cpu / gb(p.bytes);
/** The least CPU per GB of `n` runs (on a loaded machine the least is nearest the code's own cost). */
async function least(n: number, work: () => Promise<number> | number): Promise<number> {
  let best = Infinity;
  for (let i = 0; i < n; i++) best = Math.min(best, perGb(await measure(work)));
  return best;
}

type Split = { user: number; sys: number; seconds: number; bytes: number };
/** User and system CPU (this process, every thread) and wall time of `work`, per GB of the bytes it returns. */
async function measureSplit(work: () => Promise<number> | number): Promise<Split> {
  const cpu = process.cpuUsage();
  const started = performance.now();
  const bytes = await work();
  const used = process.cpuUsage(cpu);
  return { user: used.user / 1e6 / gb(bytes), sys: used.system / 1e6 / gb(bytes), seconds: (performance.now() - started) / 1000, bytes };
}
/** The run of least CPU (user + sys per GB), with every run's total and the best GB/s. */
function leastSplit(runs: Split[]): { user: number; sys: number; total: number; all: number[]; gbps: number } {
  const all = runs.map((r) => r.user + r.sys);
  const i = all.indexOf(Math.min(...all));
  return { user: runs[i].user, sys: runs[i].sys, total: all[i], all, gbps: Math.max(...runs.map((r) => gb(r.bytes) / r.seconds)) };
}

const enginePool = new Pool(engine.url, { connections: 2 });
const captureRequest = JSON.stringify({ model: STUB_CHECKPOINT, prompt: Array.from({ length: tokens }, (_, i) => i), max_tokens: 1, temperature: 0, vllm_xargs: { output_residual_stream: 'true' } });
async function receive(keep: 'chunks' | 'none' = 'chunks'): Promise<Buffer[]> {
  const res = await enginePool.request({ path: '/v1/completions', method: 'POST', body: captureRequest, headers: { 'content-type': 'application/json' } });
  const chunks: Buffer[] = [];
  for await (const chunk of res.body) if (keep === 'chunks') chunks.push(chunk as Buffer);
  return chunks;
}
const poster = new StreamPoster();
const engineUrl = new URL(engine.url);
/** As the worker receives a capture: read into its connection's one buffer (StreamPoster), each piece decoded as it is read, none kept. */
async function receiveDecoding(): Promise<void> {
  let reader: CaptureReader | null = null;
  await poster.post(engineUrl, '/v1/completions', {}, captureRequest, new AbortController().signal, {
    head: (length) => (reader = new CaptureReader({ layers, dModel }, buffers, length)),
    chunk: (piece) => (reader!.push(piece), true),
  });
  buffers.give(reader!.end().bytes);
}
/** The worker's reader, the pieces dropped. */
async function receiveReused(): Promise<number> {
  await poster.post(engineUrl, '/v1/completions', {}, captureRequest, new AbortController().signal, { head() {}, chunk: () => true });
  return 0;
}
/** Through undici's body stream, each chunk decoded as it arrives (as the worker read captures before). */
async function receiveDecodingUndici(): Promise<void> {
  const res = await enginePool.request({ path: '/v1/completions', method: 'POST', body: captureRequest, headers: { 'content-type': 'application/json' } });
  const reader = new CaptureReader({ layers, dModel }, buffers, Number(res.headers['content-length']));
  for await (const chunk of res.body) reader.push(chunk as Buffer);
  buffers.give(reader.end().bytes);
}
const httpAgent = new HttpAgent({ keepAlive: true });
function receiveBare(): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${engine.url}/v1/completions`, { method: 'POST', agent: httpAgent, headers: { 'content-type': 'application/json' } }, (res) => {
      let n = 0;
      res.on('data', (c: Buffer) => (n += c.length));
      res.on('end', () => resolve(n));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(captureRequest);
  });
}
const samples = 8;
const bodies: Buffer[][] = [];
for (let i = 0; i < 3; i++) bodies.push(await receive());

const parts: { name: string; cpu: number; floorName: string; floor: number | null }[] = [];

const buffers = new CaptureBuffers({ keep: 4 });
// Captures in flight as the worker has them (a batch's worth at once).
const inFlight = async (one: () => Promise<unknown>) => {
  for (let i = 0; i < samples; i += batchSize) await Promise.all(Array.from({ length: batchSize }, one));
  return samples * promptBytes;
};
const receiveCpu = await least(2, () => inFlight(receiveReused));
const receiveUndiciCpu = await least(2, () => inFlight(() => receive('none')));
const receiveFloor = await least(2, () => inFlight(receiveBare));
parts.push({ name: "receive (the worker's reader: one reused buffer per connection, pieces dropped)", cpu: receiveCpu, floorName: 'node:http, chunks dropped', floor: receiveFloor });
parts.push({ name: '(for scale) receive through undici, chunks dropped', cpu: receiveUndiciCpu, floorName: 'node:http, chunks dropped', floor: receiveFloor });
const streamedCpu = await least(2, () => inFlight(receiveDecoding));
const streamedUndiciCpu = await least(2, () => inFlight(receiveDecodingUndici));
const collectedCpu = await least(2, () => inFlight(async () => buffers.give(decodeCapture(await receive(), { layers, dModel }, buffers).bytes)));
const decodeCpu = await least(3, () => {
  for (let i = 0; i < samples; i++) buffers.give(decodeCapture(bodies[i % bodies.length], { layers, dModel }, buffers).bytes);
  return samples * promptBytes;
});
// The floor: Node's native decoder on the same text, already a string, into a buffer it allocates.
const base64Text = Buffer.concat(bodies[0]).toString('latin1').split('"data":"')[1].split('"')[0];
const base64Floor = await least(3, () => {
  for (let i = 0; i < samples; i++) Buffer.from(base64Text, 'base64');
  return samples * promptBytes;
});
parts.push({ name: 'decode (scan + base64 into place, from a body in memory)', cpu: decodeCpu, floorName: "Buffer.from(text, 'base64') on a string", floor: base64Floor });
parts.push({ name: '**receive + decode as the worker runs them** (each chunk decoded as it arrives)', cpu: streamedCpu, floorName: 'the two floors above', floor: receiveFloor + base64Floor });
parts.push({ name: "receive + decode through undici's body stream, each chunk decoded as it arrives (as before)", cpu: streamedUndiciCpu, floorName: 'the two floors above', floor: receiveFloor + base64Floor });
parts.push({ name: 'receive + decode through undici, each body collected whole then decoded', cpu: collectedCpu, floorName: 'the two floors above', floor: receiveFloor + base64Floor });

const f32Raw = Buffer.alloc(promptBytes * 2);
const f32Words = new Float32Array(f32Raw.buffer, f32Raw.byteOffset, promptBytes / 2);
for (let i = 0; i < f32Words.length; i++) f32Words[i] = Math.sin(i) * 3;
const f32Body = Buffer.concat([Buffer.from('{"activations":{"residual_stream":{"data":"'), Buffer.from(f32Raw.toString('base64'), 'latin1'), Buffer.from(`","dtype":"float32","original_dtype":"torch.float32","compression":null,"shape":[${layers},${tokens},${dModel}]}}}`)]);
// In 64 KiB chunks, as a body arrives (the bf16 bodies above are the engine's chunks).
const f32Chunks = Array.from({ length: Math.ceil(f32Body.length / 65536) }, (_, i) => f32Body.subarray(i * 65536, (i + 1) * 65536));
const f32Cpu = await least(3, () => {
  for (let i = 0; i < samples / 2; i++) buffers.give(decodeCapture(f32Chunks, { layers, dModel }, buffers).bytes);
  return (samples / 2) * promptBytes;
});
parts.push({ name: 'convert float32 captures (decode twice the text, round to bf16)', cpu: f32Cpu - decodeCpu, floorName: 'decode floor of the extra text', floor: base64Floor });

// Write and hash, interleaved with their floors: every round runs each variant once, in turn (page-cache
// allocation cost on a VM drifts by several times within minutes); a variant's figure is its least-CPU
// round, user and sys beside. The sink's commit hashes the file it wrote (read back in the hashing
// thread); its write part is the CPU of its write calls alone.
const storage = fileHarvestStorage(join(dir, 'parts'));
const payload = Buffer.alloc(promptBytes, 0x33);
const shardBytes = shardSize * promptBytes;
const written: string[] = [];
let shardNo = 0;
const hot = Buffer.alloc(1 << 20, 0x33);
const aligned = new Uint8Array(fixedMemory(128).buffer).fill(0x33); // 8 MiB on a 64 KiB boundary
/** The same bytes in kernel memory, placed as their file offsets (the worker's captures): written from where they lie. */
const placedPayload = new CaptureBuffers({ keep: 1 }).take(promptBytes, 0).fill(0x33);
/** CPU seconds (all threads) spent in the sink's write calls (staging, direct and edge writes) of the current round. */
const sinkWrites = { user: 0, sys: 0 };
const sinkWriteRuns: { user: number; sys: number }[] = [];
const placedWrites = { user: 0, sys: 0 };
const placedWriteRuns: { user: number; sys: number }[] = [];
/** Two shards through the sink, batch by batch from `from`; the CPU of its write calls added to `into`. */
async function sinkShards(from: Uint8Array, into: { user: number; sys: number }): Promise<number> {
  for (let s = 0; s < 2; s++) {
    const file = shardFileName(shardNo++, 'cl_parts');
    const sink = await storage.createShard('hj_parts', file);
    const cpu = process.cpuUsage();
    for (let b = 0; b < shardSize; b += batchSize) await sink.write(b * promptBytes, Array.from({ length: Math.min(batchSize, shardSize - b) }, () => from));
    const used = process.cpuUsage(cpu);
    into.user += used.user / 1e6;
    into.sys += used.system / 1e6;
    await sink.commit();
    written.push(join(dir, 'parts', 'hj_parts', file));
  }
  return 2 * shardBytes;
}
const ioVariants: Record<string, () => Promise<number> | number> = {
  raw: async () => (await rawWrite([shardBytes, shardBytes], join(dir, 'raw-parts'))).bytes,
  rawDirect: async () => {
    // the same files written with O_DIRECT from an aligned buffer, 8 MiB a write, each fsynced
    mkdirSync(join(dir, 'raw-direct'), { recursive: true });
    for (let i = 0; i < 2; i++) {
      const handle = await open(join(dir, 'raw-direct', `raw-${i}`), constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_DIRECT, 0o600);
      for (let at = 0; at < shardBytes; at += aligned.length) await handle.write(aligned, 0, Math.min(aligned.length, shardBytes - at), at);
      await handle.sync();
      await handle.close();
    }
    rmSync(join(dir, 'raw-direct'), { recursive: true, force: true });
    return 2 * shardBytes;
  },
  sink: () => sinkShards(payload, sinkWrites),
  sinkPlaced: () => sinkShards(placedPayload, placedWrites),
  hash: async () => {
    for (const path of written) await hashFile(path, shardBytes, true); // as the sink reads them back
    return 2 * shardBytes;
  },
  shaHot: () => {
    const hash = createHash('sha256');
    for (let at = 0; at < shardBytes; at += hot.length) hash.update(hot);
    hash.digest();
    return shardBytes;
  },
  shaCold: () => {
    const hash = createHash('sha256');
    for (let i = 0; i < shardSize; i++) hash.update(payload);
    hash.digest();
    return shardBytes;
  },
};
const ioRounds = setting('IO_ROUNDS', 5);
const ioRuns: Record<string, Split[]> = {};
for (let round = 0; round < ioRounds; round++) {
  sinkWrites.user = sinkWrites.sys = placedWrites.user = placedWrites.sys = 0;
  for (const [name, work] of Object.entries(ioVariants)) {
    // unlinking a shard costs sys time too: kept out of the figures (the hash reads the last sink's)
    if (name.startsWith('sink')) for (const path of written.splice(0)) rmSync(path);
    (ioRuns[name] ??= []).push(await measureSplit(work));
  }
  for (const path of written.splice(0)) rmSync(path);
  sinkWriteRuns.push({ user: sinkWrites.user / gb(2 * shardBytes), sys: sinkWrites.sys / gb(2 * shardBytes) });
  placedWriteRuns.push({ user: placedWrites.user / gb(2 * shardBytes), sys: placedWrites.sys / gb(2 * shardBytes) });
}
const io = Object.fromEntries(Object.entries(ioRuns).map(([name, runs]) => [name, leastSplit(runs)]));
// The write part: the sink's write calls (staging copies, direct writes, edges), the least round; the commit is its fsync and hash.
const leastOf = (runs: { user: number; sys: number }[]) => runs.reduce((a, b) => (b.user + b.sys < a.user + a.sys ? b : a));
const writeOnly = leastOf(placedWriteRuns);
const stagedOnly = leastOf(sinkWriteRuns);
parts.push({ name: 'write (the sink\'s write calls: whole blocks written O_DIRECT from the captures\' buffers, placed as the worker places them; edges buffered)', cpu: writeOnly.user + writeOnly.sys, floorName: 'raw O_DIRECT write + fsync', floor: io.rawDirect.total });
parts.push({ name: '(for scale) write of bytes elsewhere: whole blocks staged (copied into aligned buffers) and written O_DIRECT', cpu: stagedOnly.user + stagedOnly.sys, floorName: 'raw O_DIRECT write + fsync', floor: io.rawDirect.total });
parts.push({ name: 'hash (sha256 of the file read back with O_DIRECT, own thread)', cpu: io.hash.total, floorName: 'OpenSSL SHA-256 over a buffer in cache (node:crypto)', floor: io.shaHot.total });
rmSync(join(dir, 'parts'), { recursive: true, force: true });

// Statistics as the worker sums them: captures decoded into the pool's kernel memory, summed where they lie;
// beside them captures elsewhere (copied into the kernel's memory a chunk at a time). The sums are begun
// first (the shift pass over a job's first prompt runs once a job).
const statsPool = new CaptureBuffers({ keep: bodies.length });
const inKernel = bodies.map((b) => decodeCapture(b, { layers, dModel }, statsPool).bytes);
const elsewhere = bodies.map((b) => decodeCapture(b, { layers, dModel }).bytes);
const statsOf = (captures: Buffer[]) => {
  const stats = new RunningStats(Array.from({ length: layers }, (_, i) => i), dModel);
  stats.add(captures[0], [layers, tokens, dModel]);
  return () => {
    for (let i = 0; i < samples; i++) stats.add(captures[i % captures.length], [layers, tokens, dModel]);
    return samples * promptBytes;
  };
};
const [statsInPlace, statsCopied] = [statsOf(inKernel), statsOf(elsewhere)];
// The same over 24 captures (768 MiB) each summed once a run, as the worker meets them: from memory, not the cache.
const coldPool = new CaptureBuffers({ keep: 24 });
const coldSet = Array.from({ length: 24 }, (_, i) => decodeCapture(bodies[i % bodies.length], { layers, dModel }, coldPool).bytes);
const coldStats = new RunningStats(Array.from({ length: layers }, (_, i) => i), dModel);
coldStats.add(coldSet[0], [layers, tokens, dModel]);
const statsFromMemory = () => {
  for (const capture of coldSet) coldStats.add(capture, [layers, tokens, dModel]);
  return coldSet.length * promptBytes;
};
let statsCpu = Infinity;
let statsCopiedCpu = Infinity;
let statsColdCpu = Infinity;
for (let i = 0; i < 3; i++) {
  statsCpu = Math.min(statsCpu, await least(1, statsInPlace));
  statsCopiedCpu = Math.min(statsCopiedCpu, await least(1, statsCopied));
  statsColdCpu = Math.min(statsColdCpu, await least(1, statsFromMemory));
}
for (const capture of coldSet) coldPool.give(capture);
parts.push({ name: 'stats (RunningStats.add, captures in the pool\'s kernel memory: summed in place; 3 captures cycled, in the cache)', cpu: statsCpu, floorName: 'budget', floor: null });
parts.push({ name: 'stats of 24 captures each summed once (768 MiB: from memory, as in the worker)', cpu: statsColdCpu, floorName: 'budget', floor: null });
parts.push({ name: '(for scale) stats of captures elsewhere (copied into the kernel\'s memory)', cpu: statsCopiedCpu, floorName: 'budget', floor: null });

// ---- 3. The in-process pipeline, statistics on and off ----

class NoStats extends RunningStats {
  override add(): void {}
}
/** The pipeline over the bench's bodies; `placed`: each capture decoded where its file offset lies in a 4 KiB block (as the worker does). */
async function pipeline(withStats: boolean, placed = true): Promise<number> {
  const pipeStorage = fileHarvestStorage(join(dir, 'pipeline'));
  const pool = new CaptureBuffers({ keep: 2 * batchSize + 1 });
  let total = 0;
  await runShardPipeline(
    { jobId: 'hj_bench', checkpoint: 'bench/model', layers: Array.from({ length: layers }, (_, i) => i), dModel, promptCount: 2 * shardSize, shardSize, batchSize, startShard: 0 },
    {
      storage: pipeStorage,
      buffers: pool,
      stats: withStats ? null : new NoStats(Array.from({ length: layers }, (_, i) => i), dModel),
      fileNameFor: (shard) => shardFileName(shard, 'cl_bench'),
      async captureBatch(first, count, _signal, place) {
        const captured: CapturedPrompt[] = [];
        const offsets = placed ? captureOffsets(place!, Array.from({ length: count }, () => tokens)) : [];
        for (let k = 0; k < count; k++) {
          const { shape, bytes } = decodeCapture(bodies[(first + k) % bodies.length], { layers, dModel }, pool, offsets[k]);
          captured.push({ tokens: Int32Array.from({ length: tokens }, (_, t) => t), shape, bytes });
        }
        return captured;
      },
      async onShardWritten(record) {
        total += record.bytes;
      },
    },
  );
  return total;
}
/** This process's main thread's CPU seconds (where the statistics run; the writes and the hash run in other threads). */
function mainThreadCpu(): number {
  const fields = readFileSync(`/proc/self/task/${process.pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100; // utime + stime, in USER_HZ ticks
}
const pipelineOn: number[] = [];
const pipelineOff: number[] = [];
const mainOn: number[] = [];
const mainOff: number[] = [];
const pipelineStaged: number[] = [];
const mainStaged: number[] = [];
// Interleaved, three rounds at least: the difference of two noisy figures needs the least of each.
for (let i = 0; i < Math.max(3, rounds); i++) {
  for (const variant of ['on', 'off', 'staged'] as const) {
    const main = mainThreadCpu();
    const part = await measure(() => pipeline(variant !== 'off', variant !== 'staged'));
    ({ on: pipelineOn, off: pipelineOff, staged: pipelineStaged })[variant].push(perGb(part));
    ({ on: mainOn, off: mainOff, staged: mainStaged })[variant].push((mainThreadCpu() - main) / gb(part.bytes));
    // The shards are removed outside the measure (unlinking costs sys time the pipeline does not spend).
    rmSync(join(dir, 'pipeline'), { recursive: true, force: true });
  }
}
await enginePool.close();
poster.close();
httpAgent.destroy();
await stop(engine.child);
const loadAfter = loadavg()[0];

// ---- The report ----

const rate = (r: { seconds: number; bytes: number }) => gb(r.bytes) / r.seconds;
const best = (xs: number[]) => Math.min(...xs);
const jobCpu = (k: string) => best(jobs.map((j) => j.cpu[k] / gb(j.bytes)));
const harvestRate = Math.max(...jobs.map(rate));
const rawRate = Math.max(...raws.map(rate));
const workerCpu = jobCpu('worker');
const sumParts = streamedCpu + parts.filter((p) => /^(write|hash|stats of 24)/.test(p.name)).reduce((n, p) => n + p.cpu, 0);
const f = (n: number, d = 2) => n.toFixed(d);
print(`harvest bench: ${prompts} prompts of ${layers} x ${tokens} x ${dModel} bf16 (${(promptBytes / 2 ** 20).toFixed(0)} MiB each), shards of ${shardSize}, batches of ${batchSize}: ${gb(jobs[0].bytes).toFixed(2)} GB per job; ${rounds} rounds, the best of each`);
print(`${cpus().length} x ${cpus()[0]?.model ?? 'cpu'}, ${(totalmem() / 2 ** 30).toFixed(0)} GiB, Node ${process.version}; load average ${f(loadBefore)} before, ${f(loadAfter)} after; files under ${dir}`);
print(`processes: ${db ? 'svc serve --no-workers + svc worker (PostgreSQL transport), stub engine' : 'svc serve (embedded store, its in-process worker), stub engine'}; worker pid ${workerPid}${prof.length ? `, profiled into ${process.env.BENCH_PROF_DIR}` : ''}`);
print('');
print('| the harvest, end to end | value |');
print('|---|---|');
print(`| GB/s written, best (each round) | ${f(harvestRate, 3)} (${jobs.map((j) => f(rate(j), 3)).join(', ')}) |`);
print(`| raw write + fsync of the same bytes, GB/s (each round) | ${f(rawRate, 3)} (${raws.map((r) => f(rate(r), 3)).join(', ')}) |`);
print(`| **harvest / raw** | **${f(harvestRate / rawRate)}** |`);
print(`| raw write + fsync of the same bytes (through the page cache), CPU s per GB, least (each) | ${f(best(raws.map((r) => r.cpu / gb(r.bytes))))} (${raws.map((r) => f(r.cpu / gb(r.bytes))).join(', ')}) |`);
for (const k of Object.keys(jobs[0].cpu)) print(`| CPU s per GB, ${k === 'worker' && !db ? 'worker (+ gateway: one process)' : k}${k === 'postgres' ? ' (shared server: other clients too)' : ''}, least (each) | ${k === 'worker' ? '**' : ''}${f(jobCpu(k))}${k === 'worker' ? '**' : ''} (${jobs.map((j) => f(j.cpu[k] / gb(j.bytes))).join(', ')}) |`);
const split = (x: { user: number; sys: number }) => `${f(x.user + x.sys)} (${f(x.user)} + ${f(x.sys)})`;
const leastJob = jobs.reduce((a, b) => (b.cpu.worker / gb(b.bytes) < a.cpu.worker / gb(a.bytes) ? b : a));
const perThread = (i: number) => leastJob.threads[i] / gb(leastJob.bytes);
print(`| the worker by thread, its least round: main (receive, decode, statistics, staging the direct writes, claims): user + sys | ${split({ user: perThread(0), sys: perThread(1) })} |`);
print(`| the worker's other threads (user: SHA-256 in the hash thread, GC helpers; sys: the shard writes and the hash's reads, libuv's pool and the hash thread): user + sys | ${split({ user: perThread(2), sys: perThread(3) })} |`);
print('');
print('| the worker\'s parts, each alone (CPU s per GB of shard, all threads, least of runs) | CPU s/GB | floor | floor CPU s/GB | above floor |');
print('|---|---|---|---|---|');
for (const p of parts) print(`| ${p.name} | ${f(p.cpu)} | ${p.floorName} | ${p.floor === null ? '0.30 (at most)' : f(p.floor)} | ${p.floor === null ? '' : `${f(p.cpu - p.floor)} (${f(p.cpu / p.floor)}x)`} |`);
print(`| sum of the worker's bf16 parts (receive + decode as run, write, hash, stats) | ${f(sumParts)} | | | |`);
print(`| the rest (metering, claims, records, tokenizing, HTTP to the store): the worker's total less the parts | ${f(Math.max(0, workerCpu - sumParts))} | | | |`);
print('');
print(`| write and hash, interleaved with their floors (${ioRounds} rounds, 2 shards each): CPU s per GB | least: total (user + sys) | each round's total | GB/s, best |`);
print('|---|---|---|---|');
const ioRow = (label: string, name: string) => print(`| ${label} | ${split(io[name])} | ${io[name].all.map((x) => f(x)).join(', ')} | ${f(io[name].gbps)} |`);
ioRow('raw write + fsync, through the page cache', 'raw');
ioRow('raw write + fsync with O_DIRECT (the write floor: the sink writes whole blocks so)', 'rawDirect');
ioRow('**shard sink**: whole blocks written O_DIRECT from the captures\' buffers, edges buffered, commit (fsync + hash read back + rename + dir fsync)', 'sinkPlaced');
ioRow('shard sink of bytes elsewhere: whole blocks staged, the same commit', 'sink');
ioRow('hash alone: the sink\'s read-back of the same files (hashing thread, O_DIRECT)', 'hash');
ioRow('SHA-256 floor: OpenSSL over a 1 MiB buffer in cache', 'shaHot');
ioRow('SHA-256 over the captures\' own buffers (32 MiB each, from memory)', 'shaCold');
print(`| **write** (the sink's write calls, least round) against raw O_DIRECT | ${split(writeOnly)} | | **${f((writeOnly.user + writeOnly.sys) / io.rawDirect.total)}x raw O_DIRECT**, ${f((writeOnly.user + writeOnly.sys) / io.raw.total)}x raw through the page cache |`);
print(`| **sink** against raw O_DIRECT + SHA-256 floor | ${f(io.sinkPlaced.total)} against ${f(io.rawDirect.total + io.shaHot.total)} | | **${f(io.sinkPlaced.total / (io.rawDirect.total + io.shaHot.total))}x** |`);
print('');
print('| the in-process pipeline (decode + write + hash, no HTTP) | CPU s per GB, all threads, least (each) | main thread (decode, statistics), least (each) |');
print('|---|---|---|');
print(`| statistics on | ${f(best(pipelineOn))} (${pipelineOn.map((x) => f(x)).join(', ')}) | ${f(best(mainOn))} (${mainOn.map((x) => f(x)).join(', ')}) |`);
print(`| statistics off | ${f(best(pipelineOff))} (${pipelineOff.map((x) => f(x)).join(', ')}) | ${f(best(mainOff))} (${mainOff.map((x) => f(x)).join(', ')}) |`);
print(`| **the statistics' cost** (on less off; alone: ${f(statsCpu)}) | ${f(best(pipelineOn) - best(pipelineOff))} | **${f(best(mainOn) - best(mainOff))}** |`);
print(`| statistics on, captures not placed (every whole block staged) | ${f(best(pipelineStaged))} (${pipelineStaged.map((x) => f(x)).join(', ')}) | ${f(best(mainStaged))} (${mainStaged.map((x) => f(x)).join(', ')}) |`);
print(`| **the staging copy's cost** (not placed less on) | ${f(best(pipelineStaged) - best(pipelineOn))} | **${f(best(mainStaged) - best(mainOn))}** |`);
process.stdout.write(`${out.join('\n')}\n`);
