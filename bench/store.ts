/**
 * Event store throughput: events/s for 1 writer and for 64 concurrent writers, on each adapter.
 * Each writer appends one event per call to its own stream with an exact expected version
 * (optimistic-concurrency check included) and waits for the acknowledgement before the next.
 * PGlite always (on disk, in a temp dir); PostgreSQL when DATABASE_URL is set (in a scratch schema).
 *   node --import tsx bench/store.ts [seconds per run, default 3]
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
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
