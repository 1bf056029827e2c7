/**
 * Event store throughput: events/s for 1 writer and for 64 concurrent writers, on each adapter.
 * Each writer appends one event per call to its own stream with an exact expected version
 * (optimistic-concurrency check included) and waits for the acknowledgement before the next.
 * PGlite always (on disk, in a temp dir); PostgreSQL when DATABASE_URL is set (in a scratch schema),
 * plus the same 64 writers spread over 3 processes sharing one schema (what notifications and
 * cross-process locks cost). BENCH_NOTIFY=0 opens the stores without cross-process wake-up hints.
 *   node --import tsx bench/store.ts [seconds per run, default 3]
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { openEventStore, type EventStore } from '../src/store/index.ts';

const seconds = Number(process.argv[2] ?? process.env.BENCH_SECONDS ?? 3);
const payload = { model: 'ref-byte', input_tokens: 412, output_tokens: 128, status: 200, latency_ms: 1234, key_prefix: 'sk-abc123' };

async function run(store: EventStore, writers: number): Promise<number> {
  const deadline = performance.now() + seconds * 1000;
  const started = performance.now();
  let events = 0;
  await Promise.all(
    Array.from({ length: writers }, async () => {
      const stream = `bench-${randomUUID()}`;
      for (let version = 0; performance.now() < deadline; version++) {
        await store.append(stream, [{ id: randomUUID(), type: 'RequestSettled', data: payload }], version);
        events++;
      }
    }),
  );
  return events / ((performance.now() - started) / 1000);
}

async function bench(label: string, open: () => Promise<EventStore>, done: () => Promise<void>): Promise<void> {
  const store = await open();
  try {
    await run(store, 8); // warm-up: JIT, connections, plan cache
    for (const writers of [1, 64]) {
      const rate = await run(store, writers);
      console.log(`store ${label.padEnd(9)} ${String(writers).padStart(2)} writer${writers === 1 ? ' ' : 's'}: ${Math.round(rate).toLocaleString('en-US').padStart(7)} events/s`);
    }
  } finally {
    await store.close();
    await done();
  }
}

/**
 * The yardsticks, measured in the same minute so that figures from a busy machine can be
 * compared: plain multi-row INSERTs of 64 events (no checks, no ids) and one event per commit.
 */
async function baselines(url: string, schema: string): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await client.query(`CREATE TABLE "${schema}".plain_insert (id bigserial PRIMARY KEY, stream_id text NOT NULL, data jsonb NOT NULL)`);
    const values = Array.from({ length: 64 }, (_, i) => `($${2 * i + 1}, $${2 * i + 2})`).join(', ');
    const data = JSON.stringify(payload);
    let started = performance.now();
    let events = 0;
    while (performance.now() - started < seconds * 1000) {
      await client.query(`INSERT INTO "${schema}".plain_insert (stream_id, data) VALUES ${values}`, Array.from({ length: 64 }, () => [`bench-${randomUUID()}`, data]).flat());
      events += 64;
    }
    console.log(`baseline  plain 64-row INSERTs, 1 connection: ${Math.round(events / ((performance.now() - started) / 1000)).toLocaleString('en-US').padStart(7)} events/s`);
    started = performance.now();
    events = 0;
    while (performance.now() - started < seconds * 1000) {
      await client.query(`INSERT INTO "${schema}".plain_insert (stream_id, data) VALUES ($1, $2)`, [`bench-${randomUUID()}`, data]);
      events += 1;
    }
    console.log(`baseline  one event per commit, 1 writer:   ${Math.round(events / ((performance.now() - started) / 1000)).toLocaleString('en-US').padStart(7)} events/s`);
  } finally {
    await client.end();
  }
}

const notify = process.env.BENCH_NOTIFY !== '0';

/** One of the 3 processes: opens its own store on the shared schema, waits for the start signal, writes. */
async function child(url: string, schema: string, writers: number): Promise<void> {
  const store = await openEventStore({ databaseUrl: url, schema, notifyOtherProcesses: notify });
  await run(store, 4); // warm-up
  process.stdout.write('ready\n');
  await new Promise((resolve) => process.stdin.once('data', resolve));
  const rate = await run(store, writers);
  process.stdout.write(`${rate}\n`);
  await store.close();
}

async function processes(url: string, count: number, writers: number): Promise<void> {
  const schema = `bench_${randomBytes(4).toString('hex')}`;
  const setup = await openEventStore({ databaseUrl: url, schema });
  await setup.close();
  const self = fileURLToPath(import.meta.url);
  try {
    const children = Array.from({ length: count }, (_, i) => {
      const each = Math.floor(writers / count) + (i < writers % count ? 1 : 0);
      const proc = spawn(process.execPath, ['--import', 'tsx', self, String(seconds), '--child', schema, String(each)], { stdio: ['pipe', 'pipe', 'inherit'], env: process.env });
      let out = '';
      const ready = new Promise<void>((resolve) => proc.stdout.on('data', (d) => ((out += d), out.includes('ready') && resolve())));
      const done = new Promise<number>((resolve, reject) => proc.on('exit', (code) => (code === 0 ? resolve(Number(out.trim().split('\n').pop())) : reject(new Error(`child exited ${code}`)))));
      return { proc, ready, done };
    });
    await Promise.all(children.map((c) => c.ready));
    for (const c of children) c.proc.stdin.end('go\n');
    const rates = await Promise.all(children.map((c) => c.done));
    const total = rates.reduce((a, b) => a + b, 0);
    console.log(`store postgres ${writers} writers in ${count} processes${notify ? '' : ' (no NOTIFY)'}: ${Math.round(total).toLocaleString('en-US').padStart(7)} events/s`);
  } finally {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    await client.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await client.end();
  }
}

if (process.argv[3] === '--child') {
  await child(process.env.DATABASE_URL!, process.argv[4], Number(process.argv[5]));
  process.exit(0);
}

const dir = mkdtempSync(join(tmpdir(), 'svc-bench-store-'));
if (process.env.BENCH_SKIP_PGLITE !== '1') await bench('pglite', () => openEventStore({ dataDir: dir, purpose: 'bench' }), async () => rmSync(dir, { recursive: true, force: true }));

const url = process.env.DATABASE_URL;
if (url) {
  const schema = `bench_${randomBytes(4).toString('hex')}`;
  await bench('postgres', () => openEventStore({ databaseUrl: url, schema, maxInFlight: Number(process.env.BENCH_IN_FLIGHT ?? 0) || undefined }), async () => {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    await client.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await client.end();
  });
  await processes(url, 3, 64);
  const scratch = `bench_${randomBytes(4).toString('hex')}`;
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  await admin.query(`CREATE SCHEMA "${scratch}"`);
  try {
    await baselines(url, scratch);
  } finally {
    await admin.query(`DROP SCHEMA "${scratch}" CASCADE`);
    await admin.end();
  }
} else {
  console.log('store postgres: skipped (set DATABASE_URL)');
}
