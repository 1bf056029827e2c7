/**
 * Loading a key however long its history: one million meter events over 50 past days (20,000 a
 * day, each day opened with its month-to-date balance), then the time to load the key as admission
 * does on a cold cache: today's meter stream (opened from yesterday's balance, which closes
 * yesterday first) and a first reservation decided on it. PostgreSQL when DATABASE_URL is set, else PGlite.
 *   node --import tsx bench/key-load.ts [events, default 1000000]
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { CommandHandler } from '../src/command-handler/index.ts';
import { openEventStore, type EventStore, type NewEvent } from '../src/store/index.ts';
import { Metering } from '../src/metering/index.ts';
import { createLogger } from '../src/api/index.ts';
import { meterStream } from '../events/meter.ts';
import { percentile, withScratchSchemaStore } from './support.ts';
import { admitRequest } from '../test/support/admit-request.ts';

const total = Number(process.argv[2] ?? 1_000_000);
const days = 50;
const perDay = Math.floor(total / days);
const keyId = randomBytes(6).toString('hex');
const dayOf = (back: number) => new Date(Date.now() - back * 86_400_000).toISOString().slice(0, 10);

async function fill(store: EventStore): Promise<void> {
  const started = performance.now();
  for (let back = days; back >= 1; back--) {
    const day = dayOf(back);
    const stream = meterStream(keyId, day);
    const facts = { key_prefix: keyId, email: 'bench@example.org', client_ip: null, endpoint: '/v1/completions', model: 'bench', user: null, workload: null };
    const events: NewEvent[] = [
      { id: randomUUID(), type: 'MeterOpened', data: { key_id: keyId, day, month_input_tokens: 0, month_output_tokens: 0, carried_from: null, carried_holds: [], recent_starts: [], at: `${day}T00:00:00.000Z` } },
    ];
    for (let i = 1; i < perDay; i += 2) {
      const request_id = `r-${day}-${i}`;
      // Spread over the day, as real traffic is (the meter keeps the last minute's starts).
      const at = new Date(Date.parse(`${day}T00:00:00.000Z`) + Math.floor((i * 86_400_000) / perDay)).toISOString();
      events.push({ id: randomUUID(), type: 'BudgetReserved', data: { ...facts, request_id, input_tokens: 5, output_tokens: 16, max_tokens_requested: 16, max_tokens_applied: 16, choices: 1, clamped_by: null, at, expires_at: new Date(Date.parse(at) + 1_200_000).toISOString() } });
      events.push({ id: randomUUID(), type: 'UsageSettled', data: { ...facts, request_id, input_tokens: 5, output_tokens: 16, status: 200, latency_ms: 20, gpu_seconds: 0.02, cost: 0, disconnected: false, at } });
    }
    for (let at = 0; at < events.length; at += 1000) await store.append(stream, events.slice(at, at + 1000), at);
  }
  console.log(`key-load: wrote ${(days * perDay).toLocaleString('en-US')} events over ${days} days in ${((performance.now() - started) / 1000).toFixed(1)} s`);
}

async function bench(label: string, store: EventStore): Promise<void> {
  await fill(store);
  const logger = createLogger('warn');
  const times: number[] = [];
  for (let round = 0; round < 20; round++) {
    // A cold process each round: a new handler (empty cache). Today's stream of each round is new.
    const handler = new CommandHandler({ store });
    const metering = new Metering({ handler, store, logger, reservationTtlMs: 60_000, dailySpendCap: null });
    const started = performance.now();
    const admission = await metering.admit(
      admitRequest(keyId, { budgets: { monthly_token_budget: 1e12 }, maxTokens: 16, limits: { maxActive: 1_000_000, perMinute: 1_000_000 }, email: 'bench@example.org', model: 'bench' }),
    );
    await admission.durable;
    times.push(performance.now() - started);
    await metering.stop();
  }
  const first = times.shift()!;
  times.sort((a, b) => a - b);
  console.log(`key-load ${label.padEnd(8)} cold load + first reservation, key with ${(days * perDay).toLocaleString('en-US')} historical events: opening the day from history ${first.toFixed(1)} ms; today's stream, cold cache: p50 ${percentile(times, 50).toFixed(1)} ms, max ${times[times.length - 1].toFixed(1)} ms (19 cold caches; target < 100 ms)`);
}

const url = process.env.DATABASE_URL;
if (url) await withScratchSchemaStore(url, (store) => bench('postgres', store));
else {
  const store = await openEventStore({ inMemory: true });
  try {
    await bench('pglite', store);
  } finally {
    await store.close();
  }
}
