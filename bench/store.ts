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
} else {
  console.log('store postgres: skipped (set DATABASE_URL)');
}
