/**
 * Projection rebuild throughput: fills a scratch store with settled-request events, then drops and
 * replays a ledger projection (one row per event plus per-stream totals), printing events/s.
 * PGlite always (in memory); PostgreSQL when DATABASE_URL is set (in a scratch schema).
 *   node --import tsx bench/projections.ts [events, default 200000]
 */
import { randomBytes, randomUUID } from 'node:crypto';
import pg from 'pg';
import { ProjectionRunner } from '../src/projection-runner/index.ts';
import { openEventStore, type EventStore } from '../src/store/index.ts';
import { ledgerProjection } from '../test/projection-runner/fixtures.ts';

const total = Number(process.argv[2] ?? process.env.BENCH_EVENTS ?? 200_000);

async function fill(store: EventStore): Promise<void> {
  const streams = 1000;
  const perAppend = 50;
  let written = 0;
  const versions = new Map<string, number>();
  const ids = Array.from({ length: streams }, () => `meter-${randomUUID()}`);
  while (written < total) {
    const round: Promise<unknown>[] = [];
    for (let s = 0; s < 64 && written < total; s++, written += perAppend) {
      const stream = ids[(written / perAppend) % streams];
      const version = versions.get(stream) ?? 0;
      versions.set(stream, version + perAppend);
      const events = Array.from({ length: perAppend }, (_, i) => ({
        id: randomUUID(),
        type: 'RequestSettled',
        data: { tokens: (written + i) % 500, model: 'ref-byte', status: 200, latency_ms: 812 },
        metadata: { request_id: randomUUID() },
      }));
      round.push(store.append(stream, events, version));
    }
    await Promise.all(round);
  }
}

async function bench(label: string, store: EventStore, done: () => Promise<void>): Promise<void> {
  try {
    await fill(store);
    const runner = new ProjectionRunner({ store, projections: [ledgerProjection] });
    const report = await runner.rebuild(ledgerProjection.name);
    console.log(
      `projections ${label.padEnd(8)} rebuild: ${report.events.toLocaleString('en-US')} events in ${report.seconds.toFixed(2)} s = ${Math.round(report.eventsPerSecond).toLocaleString('en-US')} events/s`,
    );
  } finally {
    await store.close();
    await done();
  }
}

await bench('pglite', await openEventStore({ inMemory: true }), async () => {});

const url = process.env.DATABASE_URL;
if (url) {
  const schema = `bench_${randomBytes(4).toString('hex')}`;
  await bench('postgres', await openEventStore({ databaseUrl: url, schema }), async () => {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    await client.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await client.end();
  });
} else {
  console.log('projections postgres: skipped (set DATABASE_URL)');
}
