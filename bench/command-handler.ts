/**
 * The command path: 64 commands on one stream in one process. Decisions are made in memory and the
 * durable appends run alongside, so 64 commands should finish in about the time of one or two
 * group-commit round trips, not 64 in a row. Reported next to one append's round trip and next to
 * the old way (each command waiting for the previous one's append), on PGlite and, with
 * DATABASE_URL, PostgreSQL.
 *   node --import tsx bench/command-handler.ts [rounds, default 200]
 */
import { randomUUID } from 'node:crypto';
import { CommandHandler } from '../src/command-handler/index.ts';
import { defineEvent, eventCatalogue, Type, type Decider, type EventOf } from '../src/event-sourcing/index.ts';
import { openEventStore, type EventStore } from '../src/store/index.ts';
import { percentile, withScratchSchemaStore } from './support.ts';

const rounds = Number(process.argv[2] ?? 200);
const Reserved = defineEvent('Reserved', Type.Object({ tokens: Type.Integer(), request_id: Type.String() }));
type Event = EventOf<typeof Reserved>;
const meter: Decider<{ reserved: number }, { tokens: number; requestId: string }, Event> = {
  events: eventCatalogue('bench', [Reserved]),
  initialState: () => ({ reserved: 0 }),
  evolve: (state, event) => ({ reserved: state.reserved + event.data.tokens }),
  decide: (command) => Reserved({ tokens: command.tokens, request_id: command.requestId }),
};

const fmt = (ms: number) => `${ms.toFixed(2).padStart(6)} ms`;

async function bench(label: string, store: EventStore): Promise<void> {
  const handler = new CommandHandler({ store });
  const oneAppend: number[] = [];
  const concurrent: number[] = [];
  const serial: number[] = [];
  for (let round = 0; round < rounds; round++) {
    const stream = `meter-${randomUUID()}`;
    await handler.load(stream, meter);
    let t = performance.now();
    await handler.handle(stream, { tokens: 1, requestId: 'first' }, meter);
    oneAppend.push(performance.now() - t);
    t = performance.now();
    await Promise.all(Array.from({ length: 64 }, (_, i) => handler.handle(stream, { tokens: i, requestId: `r${i}` }, meter)));
    concurrent.push(performance.now() - t);
    if (round % 10 === 0) {
      // The old command path: each command held the stream through its own database round trip.
      t = performance.now();
      for (let i = 0; i < 64; i++) await handler.handle(stream, { tokens: i, requestId: `s${i}` }, meter);
      serial.push(performance.now() - t);
    }
  }
  const p = (xs: number[], q: number) => percentile([...xs].sort((a, b) => a - b), q);
  console.log(
    `command-handler ${label.padEnd(8)} one append: p50 ${fmt(p(oneAppend, 50))} | 64 concurrent commands, one stream: p50 ${fmt(p(concurrent, 50))}, p99 ${fmt(p(concurrent, 99))}` +
      ` (${(p(concurrent, 50) / p(oneAppend, 50)).toFixed(1)} round trips) | 64 one after another: p50 ${fmt(p(serial, 50))}`,
  );
}

const pglite = await openEventStore({ inMemory: true });
try {
  await bench('pglite', pglite);
} finally {
  await pglite.close();
}
const url = process.env.DATABASE_URL;
if (url) await withScratchSchemaStore(url, (store) => bench('postgres', store));
else console.log('command-handler postgres: skipped (set DATABASE_URL)');
