/** The adapters a store test runs against: PGlite always, PostgreSQL when DATABASE_URL is set. */
import { randomBytes, randomUUID } from 'node:crypto';
import pg from 'pg';
import { openEventStore, type EventStore, type NewEvent, type OpenEventStoreOptions } from '../../src/store/index.ts';

export interface AdapterUnderTest {
  name: 'pglite' | 'postgres';
  /** Opens a store on this adapter's test database; on Postgres every call shares one fresh schema. */
  open(extra?: Partial<OpenEventStoreOptions>): Promise<EventStore>;
  /** Drops what the tests created. */
  cleanup(): Promise<void>;
}

export function adaptersUnderTest(): AdapterUnderTest[] {
  const adapters: AdapterUnderTest[] = [
    { name: 'pglite', open: (extra) => openEventStore({ inMemory: true, ...extra }), cleanup: async () => {} },
  ];
  const url = process.env.DATABASE_URL;
  if (!url) console.log('postgres adapter: skipped, with its PostgreSQL-only tests (set DATABASE_URL to run them)');
  if (url) {
    const schema = `test_${randomBytes(6).toString('hex')}`;
    adapters.push({
      name: 'postgres',
      open: (extra) => openEventStore({ databaseUrl: url, schema, ...extra }),
      async cleanup() {
        const client = new pg.Client({ connectionString: url });
        await client.connect();
        await client.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
        await client.query(`DROP SCHEMA IF EXISTS "${schema}_internal" CASCADE`); // the projections' helper tables
        await client.end();
      },
    });
  }
  return adapters;
}

export function event(type = 'Tested', data: unknown = {}, metadata?: Record<string, unknown>): NewEvent {
  return { id: randomUUID(), type, data, ...(metadata ? { metadata } : {}) };
}

export function uniqueStream(category = 'test'): string {
  return `${category}-${randomUUID()}`;
}

export interface Deferred<T = void> {
  promise: Promise<T>;
  resolve(value: T): void;
}

export function deferred<T = void>(): Deferred<T> {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}
