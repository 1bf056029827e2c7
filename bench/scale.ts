// Scale-out: metered throughput with 1, 2 and 3 gateway processes (`svc serve --no-workers`, the
// production shape of infra/deploy) on one PostgreSQL database, in front of one engine stub that answers
// at once, in one run. Phases run 1, 2, 3, 2, 1 processes (a gateway is started before its first phase
// and stopped after its last), so drift of the host shows as a difference between a count's two phases.
// Each phase: every key once through a newly started process (a key's first request in a process takes
// its slot lease and waits for that append, a cost paid once), a short warm-up, then BENCH_SECONDS of
// load split evenly over the running processes (BENCH_CONNECTIONS in all, one autocannon per process, as
// a load balancer with even spreading would give them).
//
// Keys: BENCH_SCALE_KEYS=spread (default) sends each key's requests to every process in turn, as a
// load balancer that knows nothing of keys does; =affinity gives each process its own share of the keys
// (as hashing on the Authorization header would), so a key's streams are written by one process.
//
// Measured per phase, from /proc: each gateway process's CPU per request it served, the PostgreSQL
// backends of the bench's database (and the server's background processes, which other users of the
// server share), the engine stub, the load generator (this process), and the whole machine's busy share
// (/proc/stat), which says whether the host's cores, not the code, set the ceiling. From the CPU per
// request at each process count it projects the throughput with more cores (formula printed).
//
// Needs DATABASE_URL (the embedded store serves one process): a scratch database beside it is created
// and dropped. Keys: BENCH_KEYS (default 384), used round-robin; each key's starts stay far below the
// 600 per minute limit (the bench prints the most any key saw in the whole run).
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir, totalmem } from 'node:os';
import { join } from 'node:path';
import { type ChildProcess } from 'node:child_process';
import pg from 'pg';
import { Agent, request } from 'undici';
import { KeyPool, benchModel, buildGateway, cpuSince, gatewayEnv, gatewayServeArgs, issueKeys, postLoad, scratchDatabase, spawnWithUrl, stop } from './support.ts';

const databaseUrl = process.env.DATABASE_URL;
if (!databaseUrl) {
  process.stdout.write('scale: skipped (set DATABASE_URL: several gateway processes share one PostgreSQL store)\n');
  process.exit(0);
}
const keyCount = Number(process.env.BENCH_KEYS ?? 384);
const seconds = Number(process.env.BENCH_SECONDS ?? 10);
const warmupSeconds = Number(process.env.BENCH_WARMUP_SECONDS ?? 2);
const connections = Number(process.env.BENCH_CONNECTIONS ?? 64);
const affinity = (process.env.BENCH_SCALE_KEYS ?? 'spread') === 'affinity';
/** Gateway processes per phase, in order. */
const phases = (process.env.BENCH_SCALE_PHASES ?? '1,2,3,2,1').split(',').map(Number);
const startedAt = new Date();
const loadAtStart = loadavg();

const dir = mkdtempSync(join(tmpdir(), 'svc-bench-scale-'));
const cleanups: (() => Promise<void>)[] = [async () => rmSync(dir, { recursive: true, force: true })];
try {
  await main();
} finally {
  for (const fn of cleanups.reverse()) await fn().catch((err) => process.stderr.write(`cleanup: ${err}\n`));
}

/** Jiffies of the whole machine so far (/proc/stat's first line): busy (user, nice, system, irq, softirq), stolen by the hypervisor, and all. */
function machineTicks(): { busy: number; steal: number; total: number } {
  const [user, nice, system, idle, iowait, irq, softirq, steal] = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1, 9).map(Number);
  return { busy: user + nice + system + irq + softirq, steal, total: user + nice + system + idle + iowait + irq + softirq + steal };
}

interface Gateway {
  index: number;
  url: string;
  child: ChildProcess;
}

interface PhaseResult {
  processes: number;
  seconds: number;
  requests: number;
  rps: number;
  /** Per gateway process: requests it served and its CPU µs per request it served. */
  gateways: { index: number; requests: number; cpuUs: number }[];
  /** All gateway processes' CPU over all requests, µs. */
  gatewayUs: number;
  /** The bench database's backends, µs per request. */
  postgresUs: number;
  /** The server's background processes (WAL writer, checkpointer, ...), shared with its other users, µs per request. */
  postgresBackgroundUs: number;
  engineUs: number;
  clientUs: number;
  /** The machine's busy share over the phase (1 = every core busy), and the share the hypervisor took. */
  machineBusy: number;
  machineSteal: number;
  p50: number;
  p99: number;
}

async function main(): Promise<void> {
  const engine = await spawnWithUrl(['--import', 'tsx', 'bench/instant-engine.ts', 'bench/instant'], process.env);
  cleanups.push(() => stop(engine.child));
  writeFileSync(join(dir, 'models.json'), JSON.stringify({ models: [benchModel('instant', 'bench/instant', engine.url, true)] }));
  buildGateway();

  const db = await scratchDatabase(databaseUrl!, 'scale');
  cleanups.push(db.drop);
  const dbName = new URL(db.url).pathname.slice(1);
  const admin = new pg.Client({ connectionString: databaseUrl });
  await admin.connect();
  cleanups.push(() => admin.end());
  /** Backend pids of the bench's database, and the server's own background processes. */
  async function postgresPids(): Promise<{ mine: number[]; background: number[] }> {
    const { rows } = await admin.query<{ pid: number; mine: boolean }>(
      `SELECT pid, datname = $1 AS mine FROM pg_stat_activity WHERE datname = $1 OR (datname IS NULL AND backend_type <> 'client backend')`,
      [dbName],
    );
    return { mine: rows.filter((r) => r.mine).map((r) => r.pid), background: rows.filter((r) => !r.mine).map((r) => r.pid) };
  }

  // The deployment's shape (infra/deploy): gateways run no harvest workers and dispatch through PostgreSQL.
  const env = (index: number) => gatewayEnv(dir, `data-${index}`, { DATABASE_URL: db.url, SVC_HARVEST_DIR: join(dir, 'harvest'), SVC_HARVEST_TRANSPORT: 'postgres' });
  const running: Gateway[] = [];
  const dispatcher = new Agent({ connections: 16, keepAliveTimeout: 60_000 });
  cleanups.push(() => dispatcher.close());
  let pool: KeyPool | null = null;
  /** The next key for the process at `slot` of `of` running: any key in turn, or (affinity) the next of its share. */
  const nextAuth = (slot: number, of: number) => (affinity ? pool!.nextInShare(slot, of) : pool!.next());
  const body = JSON.stringify({ prompt: 'The quick brown fox', max_tokens: 16, temperature: 0 });

  async function startGateway(index: number): Promise<Gateway> {
    const gw = await spawnWithUrl([...gatewayServeArgs(), '--no-workers'], env(index), /listening on (http:\/\/\S+)/);
    const gateway = { index, url: gw.url, child: gw.child };
    cleanups.push(() => stop(gw.child));
    const keyPool = (pool ??= new KeyPool(await issueKeys(gw.url, keyCount, 'scale')));
    // Every key once through this process: its slot lease on each key (and, on the first process, each
    // key's meter day) is taken here, not in the timed load.
    let i = 0;
    await Promise.all(
      Array.from({ length: 16 }, async () => {
        while (i < keyPool.keys.length) {
          const res = await request(`${gw.url}/v1/completions`, { method: 'POST', body, headers: { 'content-type': 'application/json', authorization: keyPool.give(i++) }, dispatcher });
          const text = await res.body.text();
          if (res.statusCode !== 200) throw new Error(`warm-up on gateway ${index}: ${res.statusCode} ${text}`);
        }
      }),
    );
    return gateway;
  }

  /** Load on every running gateway at once, `connections` split evenly; resolves with each one's result. */
  function load(duration: number) {
    const share = Math.max(1, Math.round(connections / running.length));
    return Promise.all(
      running.map((gw, slot) =>
        postLoad({ url: `${gw.url}/v1/completions`, body, connections: share, seconds: duration, authorization: () => nextAuth(slot, running.length), label: `gateway ${gw.index}` }),
      ),
    );
  }

  async function phase(processes: number): Promise<PhaseResult> {
    while (running.length < processes) running.push(await startGateway(running.length + 1));
    while (running.length > processes) await stop(running.pop()!.child);
    await load(warmupSeconds);
    const pids = await postgresPids();
    const cpu = cpuSince([...running.map((gw) => gw.child.pid!), ...pids.mine, ...pids.background, engine.child.pid!, process.pid]);
    const machineBefore = machineTicks();
    const started = performance.now();
    const results = await load(seconds);
    const elapsed = (performance.now() - started) / 1000;
    const machineAfter = machineTicks();
    // Backends opened during the phase count from zero; one that ended during it is lost (the pools keep theirs).
    const after = await postgresPids();
    const requests = results.reduce((sum, r) => sum + r.requests.total, 0);
    const perRequest = (cpuSeconds: number, n = requests) => (n > 0 ? (cpuSeconds * 1e6) / n : NaN);
    const gateways = running.map((gw, i) => ({ index: gw.index, requests: results[i].requests.total, cpu: cpu.used(gw.child.pid!) }));
    const weighted = (k: 'p50' | 'p99') => results.reduce((sum, r) => sum + r.latency[k] * r.requests.total, 0) / requests;
    return {
      processes,
      seconds: elapsed,
      requests,
      rps: requests / elapsed,
      gateways: gateways.map((g) => ({ index: g.index, requests: g.requests, cpuUs: perRequest(g.cpu, g.requests) })),
      gatewayUs: perRequest(gateways.reduce((sum, g) => sum + g.cpu, 0)),
      postgresUs: perRequest(cpu.used(...new Set([...pids.mine, ...after.mine]))),
      postgresBackgroundUs: perRequest(cpu.used(...pids.background)),
      engineUs: perRequest(cpu.used(engine.child.pid!)),
      clientUs: perRequest(cpu.used(process.pid)),
      machineBusy: (machineAfter.busy - machineBefore.busy) / Math.max(1, machineAfter.total - machineBefore.total),
      machineSteal: (machineAfter.steal - machineBefore.steal) / Math.max(1, machineAfter.total - machineBefore.total),
      // Request-weighted over the processes' generators: a rough figure, autocannon reports no histogram to merge.
      p50: weighted('p50'),
      p99: weighted('p99'),
    };
  }

  const results: PhaseResult[] = [];
  for (const processes of phases) {
    const result = await phase(processes);
    results.push(result);
    process.stdout.write(`  ${describe(result)}\n`);
  }

  const cores = cpus().length;
  const f0 = (x: number) => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : 'n/a');
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const counts = [...new Set(phases)].sort((a, b) => a - b);
  const lines = [
    `scale-out bench: metered gateways (svc serve --no-workers) on one PostgreSQL database, engine stub answering at once — ${startedAt.toISOString()} to ${new Date().toISOString()} — ${cores} cores (${cpus()[0]?.model}), ${Math.round(totalmem() / 2 ** 30)} GiB, Node ${process.version}, load average ${loadAtStart.map((x) => x.toFixed(2)).join(' ')} at start, ${loadavg().map((x) => x.toFixed(2)).join(' ')} at end`,
    `${connections} connections in all, split evenly over the processes; keys ${affinity ? 'by affinity (each process its own share)' : 'spread (each key over every process)'}; ${seconds} s per phase after ${warmupSeconds} s of warm-up; phases ${phases.join(', ')}`,
    ...counts.map((n) => {
      const rows = results.filter((r) => r.processes === n);
      const m = (k: keyof PhaseResult) => mean(rows.map((r) => r[k] as number));
      return `${n} process${n > 1 ? 'es' : ''}: ${rows.map((r) => f0(r.rps)).join(', ')} requests/s (mean ${f0(m('rps'))}); CPU µs per request: gateways ${f0(m('gatewayUs'))} in all (per process, per request it served: ${rows.map((r) => r.gateways.map((g) => `#${g.index} ${f0(g.cpuUs)}`).join(' ')).join(' | ')}), PostgreSQL ${f0(m('postgresUs'))} (+ ${f0(m('postgresBackgroundUs'))} server background), engine ${f0(m('engineUs'))}, load generator ${f0(m('clientUs'))}; machine busy ${rows.map((r) => `${Math.round(r.machineBusy * 100)} %`).join(', ')}`;
    }),
  ];

  // The ceiling here: everything shares the machine's cores, so requests/s ≈ busy cores × 1e6 / the CPU µs all processes spend per request.
  const last = [...results].reverse().find((r) => r.processes === Math.max(...phases))!;
  const total = last.gatewayUs + last.postgresUs + last.postgresBackgroundUs + last.engineUs + last.clientUs;
  lines.push(
    `ceiling at ${last.processes} processes: ${f0(total)} CPU µs per request on this machine (gateways ${f0(last.gatewayUs)}, PostgreSQL ${f0(last.postgresUs + last.postgresBackgroundUs)}, engine ${f0(last.engineUs)}, load generator ${f0(last.clientUs)}); ${(last.machineBusy * cores).toFixed(2)} of ${cores} cores busy → at most ${f0((last.machineBusy * cores * 1e6) / total)} requests/s from CPU alone (measured ${f0(last.rps)})`,
  );
  // Projection to a host with more cores: G gateway processes, each on a core of its own, serve at most
  // R(G) = G × 1e6 / g(G) requests/s, where g(G) is the gateways' CPU µs per request with G processes, and
  // PostgreSQL then needs R × p(G) / 1e6 cores. g and p are measured at each count run here and, beyond
  // them, extrapolated by a least-squares line over the phases (g rises with G when processes share work).
  const fit = (ys: number[]) => {
    const xs = results.map((r) => r.processes);
    const mx = mean(xs), my = mean(ys);
    const sxx = xs.reduce((a, x) => a + (x - mx) ** 2, 0);
    const slope = sxx > 0 ? xs.reduce((a, x, i) => a + (x - mx) * (ys[i] - my), 0) / sxx : 0;
    return { slope, at: (g: number) => my + slope * (g - mx) };
  };
  const gFit = fit(results.map((r) => r.gatewayUs));
  const pFit = fit(results.map((r) => r.postgresUs + r.postgresBackgroundUs));
  const measuredAt = (g: number, k: 'gatewayUs' | 'postgres') => {
    const rows = results.filter((r) => r.processes === g);
    return rows.length ? mean(rows.map((r) => (k === 'gatewayUs' ? r.gatewayUs : r.postgresUs + r.postgresBackgroundUs))) : null;
  };
  const projected = [1, 2, 3, 4, 8, 16, 32].map((g) => {
    const gUs = measuredAt(g, 'gatewayUs') ?? gFit.at(g);
    const pUs = measuredAt(g, 'postgres') ?? pFit.at(g);
    const rps = (g * 1e6) / gUs;
    return `G=${g}${measuredAt(g, 'gatewayUs') === null ? ' (extrapolated)' : ''}: g ${f0(gUs)} µs → ${f0(rps)} requests/s, PostgreSQL ${(rps * pUs / 1e6).toFixed(1)} cores`;
  });
  lines.push(
    `projection, R(G) = G × 1e6 / g(G), PostgreSQL cores = R × p(G) / 1e6 (g, p: the gateways' and PostgreSQL's CPU µs per request with G processes; measured where run, else the line g = ${f0(gFit.at(1))} + ${f0(gFit.slope)}·(G−1), p = ${f0(pFit.at(1))} + ${f0(pFit.slope)}·(G−1)): ${projected.join('; ')}${gFit.slope > 0 ? `; as G grows R tends to 1e6 / ${f0(gFit.slope)} = ${f0(1e6 / gFit.slope)} requests/s` : ''}`,
    `keys: ${keyCount}, round-robin over every request: at most ${pool!.most} requests on any key in the whole run (limit 600 starts per minute)`,
  );
  process.stdout.write(`${lines.join('\n')}\n`);
}

function describe(r: PhaseResult): string {
  const f0 = (x: number) => Math.round(x).toLocaleString('en-US');
  return `${r.processes} process(es): ${f0(r.rps)} requests/s (${r.requests} in ${r.seconds.toFixed(1)} s, p50 ${r.p50.toFixed(1)} ms, p99 ${r.p99.toFixed(1)} ms); CPU µs per request: gateways ${f0(r.gatewayUs)} [${r.gateways.map((g) => `#${g.index}: ${g.requests} requests, ${f0(g.cpuUs)} per request served`).join('; ')}], PostgreSQL ${f0(r.postgresUs)} + background ${f0(r.postgresBackgroundUs)}, engine ${f0(r.engineUs)}, load generator ${f0(r.clientUs)}; machine ${Math.round(r.machineBusy * 100)} % busy, ${Math.round(r.machineSteal * 100)} % stolen`;
}
