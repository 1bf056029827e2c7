// Where a request's time goes, gateway by gateway: sequential requests alternated one by one across a
// metered and an unmetered gateway (BENCH_VARIANTS, default `metered,unmetered`; `noproj` too), each on a
// PostgreSQL database of its own (DATABASE_URL, required), in front of the engine stub (answering at once,
// or after BENCH_ENGINE_DELAY_MS). Each gateway loads bench/trace-marks.mjs, which records per request
// when it started, handed the engine call to undici, wrote it, first wrote to PostgreSQL, had the engine's
// answer and wrote its response; the engine stamps when it received and answered (with a delay). Prints,
// per variant, the median of each mark from the client's send and of the steps between them, ms, over
// BENCH_REQUESTS (default 1,000) requests each after 300 each of warm-up. Medians of per-request
// differences do not add up to the medians of the totals; compare a step across variants.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir, cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { Agent, request } from 'undici';
import { KeyPool, benchCompletionBody, buildGateway, gatewayEnv, gatewayServeArgs, issueKeys, median, postLoad, root, scratchDatabase, spawnWithUrl, startInstantEngine, stop } from './support.ts';

if (!process.env.DATABASE_URL) {
  process.stdout.write('trace: skipped, it needs DATABASE_URL (a PostgreSQL database to create scratch databases beside)\n');
  process.exit(0);
}
const variants = (process.env.BENCH_VARIANTS ?? 'metered,unmetered').split(',');
const requests = Number(process.env.BENCH_REQUESTS ?? 1000);
const warmup = 300;
const delayMs = Number(process.env.BENCH_ENGINE_DELAY_MS ?? 0) || 0;
const startedAt = new Date();
const dir = mkdtempSync(join(tmpdir(), 'svc-bench-trace-'));
const cleanups: (() => Promise<unknown> | unknown)[] = [() => rmSync(dir, { recursive: true, force: true })];

/** One request as the client saw it (epoch ms) and, with a delayed engine, as the engine stamped it. */
type Seen = { sent: number; done: number; engineReceived?: number; engineAnswered?: number };
type Marks = Record<string, number>;

try {
  buildGateway();
  const engine = await startInstantEngine(dir, delayMs);
  cleanups.push(() => stop(engine.child));
  const body = benchCompletionBody;
  const gateways: { variant: string; url: string; pool: KeyPool; out: string; agent: Agent; seen: Seen[] }[] = [];
  for (const [i, variant] of variants.entries()) {
    if (!['metered', 'unmetered', 'noproj'].includes(variant)) throw new Error(`unknown variant ${variant}: metered, unmetered or noproj`);
    const db = await scratchDatabase(process.env.DATABASE_URL, `trace_${i}`);
    cleanups.push(db.drop);
    const out = join(dir, `marks-${i}.json`);
    const env = gatewayEnv(dir, `data-${i}`, { SVC_METERING: variant === 'unmetered' ? 'off' : 'on', SVC_PROJECTIONS: variant === 'noproj' ? 'off' : 'on', DATABASE_URL: db.url, TRACE_OUT: out });
    const gw = await spawnWithUrl(gatewayServeArgs(['--import', join(root, 'bench/trace-marks.mjs')]), env, /listening on (http:\/\/\S+)/);
    cleanups.push(() => stop(gw.child));
    const pool = new KeyPool(await issueKeys(gw.url, 384, `trace-${i}`));
    // Every key's meter day opened, and the process warm.
    await postLoad({ url: `${gw.url}/v1/completions`, body, connections: 64, seconds: 5, authorization: () => pool.next() });
    const agent = new Agent({ connections: 1 });
    cleanups.push(() => agent.close());
    gateways.push({ variant, url: gw.url, pool, out, agent, seen: [] });
  }
  for (let i = 0; i < warmup + requests; i++) {
    for (const g of i % 2 === 0 ? gateways : [...gateways].reverse()) {
      const sent = performance.timeOrigin + performance.now();
      const res = await request(`${g.url}/v1/completions`, { method: 'POST', dispatcher: g.agent, headers: { 'content-type': 'application/json', authorization: g.pool.next() }, body });
      const text = await res.body.text();
      const done = performance.timeOrigin + performance.now();
      if (res.statusCode !== 200) throw new Error(`${g.variant}: ${res.statusCode} ${text}`);
      const answer = JSON.parse(text) as { bench_received_at?: number; bench_answered_at?: number };
      if (i >= warmup) g.seen.push({ sent, done, engineReceived: answer.bench_received_at, engineAnswered: answer.bench_answered_at });
    }
  }
  await new Promise((resolve) => setTimeout(resolve, 1500)); // the marks' last write

  const points = ['start', 'handoff', 'engineWrite', 'pgWrite', 'engineReceived', 'engineAnswered', 'engineHeaders', 'engineEnd', 'responseWrite', 'done'];
  const steps: [string, string][] = [
    ['start', 'handoff'],
    ['handoff', 'engineWrite'],
    ['engineWrite', 'engineReceived'],
    ['engineAnswered', 'engineHeaders'],
    ['engineEnd', 'responseWrite'],
    ['responseWrite', 'done'],
  ];
  const rows = gateways.map((g) => {
    const marks = (JSON.parse(readFileSync(g.out, 'utf8')) as Marks[]).slice(-requests);
    const merged = g.seen.map((seen, i) => ({ ...marks[i], ...seen }) as Marks);
    const med = (f: (m: Marks) => number) => median(merged.map(f).filter(Number.isFinite));
    return {
      variant: g.variant,
      at: Object.fromEntries(points.map((p) => [p, med((m) => m[p] - m.sent)])),
      step: steps.map(([a, b]) => med((m) => m[b] - m[a])),
      immediateMs: med((m) => m.immediateMs),
    };
  });
  const f = (x: number) => (Number.isFinite(x) ? x.toFixed(3) : 'n/a').padStart(10);
  const lines = [
    `request trace, ${requests} sequential requests each alternated one by one, ${delayMs > 0 ? `engine taking ${delayMs} ms` : 'instant engine'}, PostgreSQL — ${startedAt.toISOString()} to ${new Date().toISOString()} — ${cpus().length} cores (${cpus()[0]?.model}), Node ${process.version}, load average ${loadavg()[0].toFixed(1)} at end`,
    `median ms from the client's send${' '.repeat(10)}${rows.map((r) => r.variant.padStart(10)).join('')}`,
    ...points.map((p) => `  ${p.padEnd(40)}${rows.map((r) => f(r.at[p])).join('')}`),
    `median ms of each step`,
    ...steps.map(([a, b], i) => `  ${`${a} to ${b}`.padEnd(40)}${rows.map((r) => f(r.step[i])).join('')}`),
    `  ${'setImmediate callbacks in hand-off to write'.padEnd(40)}${rows.map((r) => f(r.immediateMs)).join('')}`,
  ];
  process.stdout.write(`${lines.join('\n')}\n`);
} finally {
  for (const fn of cleanups.reverse()) await Promise.resolve(fn()).catch((err) => process.stderr.write(`cleanup: ${err}\n`));
}
