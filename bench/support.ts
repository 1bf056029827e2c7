import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { closeSync, existsSync, mkdirSync, openSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { createServer, type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { randomBytes } from 'node:crypto';
import autocannon from 'autocannon';
import pg from 'pg';
import { openEventStore, type EventStore } from '../src/store/index.ts';

export const root = fileURLToPath(new URL('..', import.meta.url));

/**
 * The node flags of a checkout's `npm start` (package.json's start script, "exec node [flags]
 * bin/start.js"): bin/start.js builds when needed, then runs dist/src/cli/main.js serve in its own
 * process, so the same flags apply to it.
 */
export function startScriptFlags(tree = root): string[] {
  const start: string = JSON.parse(readFileSync(join(tree, 'package.json'), 'utf8')).scripts.start;
  const command = /^(?:exec\s+)?node\s+((?:--\S+\s+)*)bin\/start\.js\s*$/.exec(start);
  if (!command) throw new Error(`${join(tree, 'package.json')}'s start script is not "exec node [flags] bin/start.js": ${start}`);
  return command[1].split(/\s+/).filter(Boolean);
}

/**
 * The gateway's command line as `npm start` runs it: its node flags, then bin/start.js (which checks the
 * build and runs `svc serve` from dist/ in the same process); `extra` node flags (a profiler) go first.
 */
export function gatewayServeArgs(extra: string[] = []): string[] {
  return [...extra, ...startScriptFlags(), 'bin/start.js'];
}

/**
 * A bench gateway's environment: the models file in `dir`, its own data directory, any free port and
 * the benches' admin token; `extra` on top (metering, projections, a database). Everything else is the
 * defaults `npm start` has, the log level (info: one line per request) included; the bench writes the
 * log to a file (`spawnWithUrl`'s `logFile`), as a service manager would.
 */
export function gatewayEnv(dir: string, dataDir: string, extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, SVC_CONFIG: join(dir, 'models.json'), DATA_DIR: join(dir, dataDir), PORT: '0', SVC_ADMIN_TOKEN: benchAdminToken, ...extra };
  if (extra.LOG_LEVEL === undefined) delete env.LOG_LEVEL;
  return env;
}

const children = new Set<ChildProcess>();
// A benchmark that fails half-way must not leave its gateway or engine running.
process.once('exit', () => {
  for (const child of children) if (child.exitCode === null) child.kill('SIGKILL');
});

/**
 * Spawns a process and resolves with the first JSON line on stdout that carries a URL, or with
 * `stderrPattern` the first match on stderr (a gateway's "listening on"). A gateway's stdout is its log:
 * it goes to `logFile` when given, else nowhere, never through this process (which is the benches' client).
 */
export async function spawnWithUrl(args: string[], env: NodeJS.ProcessEnv, stderrPattern?: RegExp, logFile?: string): Promise<{ child: ChildProcess; url: string }> {
  const log = logFile ? openSync(logFile, 'a') : null;
  const child = spawn(process.execPath, args, { cwd: root, env, stdio: ['ignore', log ?? (stderrPattern ? 'ignore' : 'pipe'), 'pipe'] });
  if (log !== null) closeSync(log);
  children.add(child);
  child.once('exit', () => children.delete(child));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no URL from ${args.join(' ')} in 60 s`)), 60_000);
    if (child.stdout) createInterface({ input: child.stdout }).on('line', (line) => {
      try {
        const parsed = JSON.parse(line);
        if (parsed.url && parsed.event === 'listening') {
          clearTimeout(timer);
          resolve(parsed.url);
        }
      } catch {
        /* log lines */
      }
    });
    let err = '';
    child.stderr!.on('data', (d) => {
      err += d;
      const m = stderrPattern && err.match(stderrPattern);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    child.once('exit', (code) => reject(new Error(`${args.join(' ')} exited ${code}: ${err.slice(-2000)}`)));
  });
  return { child, url };
}

/** Peak resident set (VmHWM) and current RSS of a process, in MB. */
export function memoryOf(pid: number): { rssMb: number; peakMb: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (field: string) => Number(status.match(new RegExp(`${field}:\\s+(\\d+)`))?.[1] ?? 0);
  return { rssMb: kb('VmRSS') / 1024, peakMb: kb('VmHWM') / 1024 };
}

/** CPU seconds (user + system) a process (or its main thread alone) has used so far; 0 once it is gone. */
export function cpuSecondsOf(pid: number, thread: 'all' | 'main' = 'all'): number {
  try {
    // Fields after the command name, which may hold spaces: utime and stime are the 12th and 13th.
    // A process's main thread is the task whose id is the process's.
    const fields = readFileSync(thread === 'main' ? `/proc/${pid}/task/${pid}/stat` : `/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
    return (Number(fields[11]) + Number(fields[12])) / 100;
  } catch {
    return 0;
  }
}

/** Process ids of this machine's PostgreSQL server processes (none when the database is elsewhere). */
export function postgresPids(): number[] {
  return readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .map(Number)
    .filter((pid) => {
      try {
        return readFileSync(`/proc/${pid}/comm`, 'utf8').trim() === 'postgres';
      } catch {
        return false;
      }
    });
}

/**
 * CPU seconds the processes use from now on: `used(...pids)` sums theirs since this call (a process not
 * seen then counts from zero, one that ended meanwhile counts nothing).
 */
export function cpuSince(pids: Iterable<number>): { used(...pids: number[]): number } {
  const before = new Map([...pids].map((pid) => [pid, cpuSecondsOf(pid)]));
  return {
    used: (...pids) => pids.reduce((sum, pid) => sum + Math.max(0, cpuSecondsOf(pid) - (before.get(pid) ?? 0)), 0),
  };
}

/**
 * CPU used per request between `start()` and `stop(requests)`, in µs, by each named process and by
 * the local PostgreSQL server (its processes summed; one that ended meanwhile counts nothing).
 */
export function cpuPerRequest(processes: Record<string, number>): { stop(requests: number): Record<string, number> } {
  const pg = postgresPids();
  const cpu = cpuSince([...Object.values(processes), ...pg]);
  return {
    stop(requests) {
      const perRequest = (seconds: number) => (requests > 0 ? (seconds * 1e6) / requests : NaN);
      const result: Record<string, number> = {};
      for (const [name, pid] of Object.entries(processes)) result[name] = perRequest(cpu.used(pid));
      result.postgres = perRequest(cpu.used(...pg));
      return result;
    },
  };
}

/**
 * API keys for load, used round-robin by every request sent with them: metering lets a key start 600
 * requests per rolling minute, so a pool counts each key's requests, for the bench to print the most.
 */
export class KeyPool {
  readonly keys: readonly string[];
  readonly #sent: Uint32Array;
  #next = 0;
  readonly #nextInShare: number[] = [];

  constructor(keys: readonly string[]) {
    if (keys.length === 0) throw new RangeError('a key pool needs keys');
    this.keys = keys;
    this.#sent = new Uint32Array(keys.length);
  }

  /** Requests given a key of the pool. */
  get sent(): number {
    return this.#sent.reduce((a, b) => a + b, 0);
  }

  /** The most requests any one key was given. */
  get most(): number {
    return Math.max(...this.#sent);
  }

  /** The Authorization header of the next key, round-robin over the pool. */
  next(): string {
    return this.give(this.#next++ % this.keys.length);
  }

  /**
   * The next key of share `slot` of `of` (the keys ≡ slot mod `of`): a process's own keys, as a
   * balancer hashing the Authorization header gives each process its share.
   */
  nextInShare(slot: number, of: number): string {
    const usable = this.keys.length - (this.keys.length % of);
    return this.give(((this.#nextInShare[slot] = (this.#nextInShare[slot] ?? 0) + 1) * of + slot) % usable);
  }

  /** The Authorization header of key `i`, counted (also a request outside the pool's turn, such as a warm-up). */
  give(i: number): string {
    this.#sent[i] += 1;
    return `Bearer ${this.keys[i]}`;
  }
}

/** Builds the compiled gateway (of this checkout, or of `tree`): the benches measure what `npm start` runs. */
export function buildGateway(tree = root): void {
  // bin/build.js stamps dist/ as current, so `bin/svc.js` runs the build rather than the sources through tsx.
  const builder = join(tree, 'bin', 'build.js');
  if (tree === root && existsSync(builder)) execFileSync(process.execPath, [builder], { cwd: tree, stdio: 'inherit' });
  else execFileSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(tree, 'tsconfig.build.json')], { stdio: 'inherit' });
}

/** A model of the benches' configuration (SVC_CONFIG) on an engine stub at `engineUrl`, with the production limits per key. */
export function benchModel(id: string, checkpoint: string, engineUrl: string, isDefault: boolean): Record<string, unknown> {
  return {
    id,
    default: isDefault,
    checkpoint,
    engine: engineUrl,
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
  };
}

/** The completion the latency benches send, one model's default: a short prompt, 16 tokens. */
export const benchCompletionBody = JSON.stringify({ prompt: 'The quick brown fox', max_tokens: 16, temperature: 0 });

/**
 * The engine stub (bench/instant-engine.ts; answering at once, or after `delayMs`) in its own process,
 * written into `dir`/models.json as the gateways' only model, `instant`. Stop it with `stop(engine.child)`.
 */
export async function startInstantEngine(dir: string, delayMs: number): Promise<{ child: ChildProcess; url: string }> {
  const engine = await spawnWithUrl(['--import', 'tsx', 'bench/instant-engine.ts', 'bench/instant', String(delayMs)], process.env);
  writeFileSync(join(dir, 'models.json'), JSON.stringify({ models: [benchModel('instant', 'bench/instant', engine.url, true)] }));
  return engine;
}

/**
 * `connections` clients (autocannon, in this process) posting `body` to `url` for `seconds`, each
 * request with the next `authorization()` header; throws on any error or answer other than 2xx.
 */
export async function postLoad(options: {
  url: string;
  body: string;
  connections: number;
  seconds: number;
  authorization: () => string;
  headers?: Record<string, string>;
  /** What failed, in the error (default the URL). */
  label?: string;
}): Promise<Awaited<ReturnType<typeof autocannon>>> {
  const { url, body, headers, authorization } = options;
  const result = await autocannon({
    url,
    connections: options.connections,
    duration: options.seconds,
    pipelining: 1,
    // 30 s, not autocannon's 10: on a loaded machine a request behind 63 others can take longer than 10 s.
    timeout: 30,
    requests: [
      {
        method: 'POST',
        body,
        headers: { 'content-type': 'application/json' },
        setupRequest: (req: Record<string, unknown>) => ({ ...req, headers: { 'content-type': 'application/json', authorization: authorization(), ...headers } }),
      },
    ],
  });
  if (result.non2xx > 0 || result.errors > 0) throw new Error(`${options.label ?? url}: ${result.non2xx} non-2xx, ${result.errors} errors (${(result as { timeouts?: number }).timeouts ?? 0} timeouts) in ${result.requests.total} requests`);
  return result;
}

export function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

/** The middle value (the upper one of an even count); NaN for none. */
export function median(xs: readonly number[]): number {
  return xs.length === 0 ? NaN : [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
}

/** `n` timings (ms) from `measure`, each after `gapMs` of idle when given, sorted. */
export async function sampledMs(n: number, gapMs: number, measure: () => Promise<number>): Promise<number[]> {
  const samples: number[] = [];
  for (let i = 0; i < n; i++) {
    if (gapMs > 0) await new Promise((resolve) => setTimeout(resolve, gapMs));
    samples.push(await measure());
  }
  return samples.sort((a, b) => a - b);
}

export function stop(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null) return resolve();
    child.once('exit', () => resolve());
    child.kill('SIGTERM');
    setTimeout(() => child.kill('SIGKILL'), 10_000).unref();
  });
}

/** The admin token the benchmarks start their gateways with (SVC_ADMIN_TOKEN). */
export const benchAdminToken = `svc_admin_bench_${randomBytes(12).toString('hex')}`;

/** Issues `count` API keys through `POST /admin/keys` (a few at a time) and returns the full keys. */
export async function issueKeys(gatewayUrl: string, count: number, label = 'bench'): Promise<string[]> {
  const keys: string[] = new Array(count);
  let next = 0;
  const worker = async () => {
    for (let i = next++; i < count; i = next++) {
      const res = await fetch(`${gatewayUrl}/admin/keys`, {
        method: 'POST',
        headers: { authorization: `Bearer ${benchAdminToken}`, 'content-type': 'application/json' },
        body: JSON.stringify({ email: `${label}-${i}@bench.invalid` }),
      });
      const body = (await res.json()) as { key?: string };
      if (res.status !== 201 || !body.key) throw new Error(`POST /admin/keys: ${res.status} ${JSON.stringify(body)}`);
      keys[i] = body.key;
    }
  };
  await Promise.all(Array.from({ length: Math.min(8, count) }, worker));
  return keys;
}

/** A fresh PostgreSQL database beside DATABASE_URL's, for a gateway under benchmark (test/support/postgres.ts). */
export { scratchDatabase } from '../test/support/postgres.ts';

/** Runs `fn` on an event store in a scratch schema of `url`'s database; the schema is dropped afterwards. */
export async function withScratchSchemaStore(url: string, fn: (store: EventStore) => Promise<void>): Promise<void> {
  const schema = `bench_${randomBytes(4).toString('hex')}`;
  const store = await openEventStore({ databaseUrl: url, schema });
  try {
    await fn(store);
  } finally {
    await store.close();
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    await client.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await client.end();
  }
}

/** The Portkey gateway the benches measure beside ours: its open-source Node.js build, from npm. */
export const portkeyVersion = '1.15.2';

/**
 * Starts Portkey's open-source gateway (`@portkey-ai/gateway`, from npm) in its own process, installed
 * on first use into a scratch folder under the system's temp directory (never a dependency of this
 * project). Null when BENCH_PORTKEY=off. Requests reach an OpenAI-compatible engine through it with
 * `portkeyHeaders(engineUrl)`.
 */
export async function startPortkey(): Promise<{ child: ChildProcess; url: string } | null> {
  if (process.env.BENCH_PORTKEY === 'off') return null;
  const dir = join(tmpdir(), `svc-bench-portkey-${portkeyVersion}`);
  const server = join(dir, 'node_modules', '@portkey-ai', 'gateway', 'build', 'start-server.js');
  if (!existsSync(server)) {
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'svc-bench-portkey', private: true }));
    execFileSync('npm', ['install', '--no-audit', '--no-fund', '--loglevel=error', `@portkey-ai/gateway@${portkeyVersion}`], { cwd: dir, stdio: ['ignore', 'ignore', 'inherit'] });
  }
  const port = await freePort();
  const child = spawn(process.execPath, [server, `--port=${port}`, '--headless'], { cwd: dir, env: { ...process.env, NODE_ENV: 'production' }, stdio: 'ignore' });
  children.add(child);
  child.once('exit', () => children.delete(child));
  const url = `http://127.0.0.1:${port}`;
  for (const started = Date.now(); ; ) {
    if (child.exitCode !== null) throw new Error(`Portkey's gateway exited with ${child.exitCode}`);
    const up = await fetch(url).then(() => true, () => false);
    if (up) return { child, url };
    if (Date.now() - started > 60_000) throw new Error("Portkey's gateway did not answer in 60 s");
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** The headers that send a request through Portkey to an OpenAI-compatible engine at `engineUrl`. */
export function portkeyHeaders(engineUrl: string): Record<string, string> {
  return { 'x-portkey-provider': 'openai', 'x-portkey-custom-host': `${engineUrl}/v1` };
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.once('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as AddressInfo;
      probe.close(() => resolve(port));
    });
  });
}
