/**
 * The embedded store's SQL port cannot stall or bloat the gateway: a statement that sleeps is ended at
 * the statement timeout (57014) while HTTP requests, a completion included, are answered meanwhile;
 * a statement that builds a huge string ends in out of memory (53200) without the gateway's memory
 * growing by it; and the port answers the next statement after either. A real gateway (in this
 * process, so its memory is this process's) with reference engines, and `pg` over the wire.
 */
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { execFileSync } from 'node:child_process';
import pg from 'pg';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';

const memoryMb = 256;
process.env.SVC_SQL_STATEMENT_TIMEOUT_MS = '4000';
process.env.SVC_SQL_MEMORY_MB = String(memoryMb);

const passwords = { analyst: 'limits-test-analyst', owner: 'limits-test-owner' };
let gw: TestGateway;

test.before(async () => {
  gw = await startTestGateway({}, { sqlPort: 0, sqlPasswords: passwords });
});
test.after(async () => {
  await gw?.stop();
});

async function analyst(): Promise<pg.Client> {
  const client = new pg.Client({ host: '127.0.0.1', port: gw.sqlPort!, user: 'analyst', database: 'svc', password: passwords.analyst });
  await client.connect();
  return client;
}

test('a sleeping statement is ended at the statement timeout while the gateway answers HTTP; the port serves on', async () => {
  const complete = () =>
    fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'hi', max_tokens: 1 }) });
  assert.is((await complete()).status, 200); // the engine answers before the clock of the statement below starts
  const client = await analyst();
  try {
    assert.equal((await client.query('SELECT count(*) > 0 AS any FROM events')).rows, [{ any: true }]);
    const order: string[] = [];
    const sleeping = client.query('SELECT pg_sleep(30)').then(
      () => {
        order.push('sleep ended');
        return null;
      },
      (error: pg.DatabaseError) => {
        order.push('sleep ended');
        return error;
      },
    );
    await new Promise((r) => setTimeout(r, 300)); // the statement reaches the port and runs
    const health = await fetch(`${gw.url}/health`);
    assert.is(health.status, 200);
    order.push('health');
    const completion = await complete();
    assert.is(completion.status, 200, await completion.clone().text());
    order.push('completion');
    const error = await sleeping;
    assert.equal(order, ['health', 'completion', 'sleep ended']);
    assert.ok(error, 'pg_sleep(30) was not ended');
    assert.is(error!.code, '57014', error!.message);
    assert.match(error!.message, /statement timeout/);
    // The same connection, then a new one, go on reading.
    assert.equal((await client.query('SELECT 1 AS one')).rows, [{ one: 1 }]);
  } finally {
    await client.end();
  }
  const next = await analyst();
  try {
    assert.equal((await next.query('SELECT count(*) > 0 AS any FROM events')).rows, [{ any: true }]);
  } finally {
    await next.end();
  }
});

/** Resident memory of a process, MiB (Linux `ps`). */
const rssMb = (pid: number) => Number(execFileSync('ps', ['-o', 'rss=', '-p', String(pid)], { encoding: 'utf8' }).trim()) / 1024;

test('a statement that builds a huge string fails with out of memory; the gateway does not grow; the port serves on', async () => {
  const client = await analyst();
  try {
    await client.query('SELECT 1');
    const before = rssMb(process.pid);
    const error = await client.query(`SELECT length(string_agg(repeat('x', 1024 * 1024), '')) AS n FROM generate_series(1, 900)`).then(
      (r) => r.rows,
      (e: pg.DatabaseError) => e,
    );
    assert.instance(error, pg.DatabaseError, `the 900 MiB string was built: ${JSON.stringify(error)}`);
    assert.is((error as pg.DatabaseError).code, '53200', (error as pg.DatabaseError).message);
    const after = rssMb(process.pid);
    assert.ok(after < before + memoryMb, `the gateway grew from ${before.toFixed(0)} to ${after.toFixed(0)} MiB`);
    // The port's own process stays within its bound (its database memory, plus PGlite's code and its JavaScript).
    const children = execFileSync('ps', ['-o', 'pid=,args=', '--ppid', String(process.pid)], { encoding: 'utf8' })
      .split('\n')
      .filter((l) => l.includes('--max-old-space-size'))
      .map((l) => Number(l.trim().split(/\s+/)[0]));
    assert.is(children.length, 1, 'one snapshot process');
    assert.ok(rssMb(children[0]) < memoryMb + 256, `the snapshot process holds ${rssMb(children[0]).toFixed(0)} MiB`);
    assert.equal((await client.query('SELECT count(*) > 0 AS any FROM events')).rows, [{ any: true }]);
  } finally {
    await client.end();
  }
});

test.run();
