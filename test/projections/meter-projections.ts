/**
 * key_usage, usage_ledger, daily_spend and meter_holds over events the real deciders write: exact
 * rows, idempotence (apply twice), and `svc projections rebuild` reproducing every table row for row.
 * Run by meter-projections-pglite.test.ts and meter-projections-postgres.test.ts.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { internalTable, logStart, type EventStore, type Queryable, type RecordedEvent } from '../../src/store/index.ts';
import { ProjectionRunner, runProjectionsCommand } from '../../src/processors/index.ts';
import { dailySpendProjection, expiredHolds, keyUsageOfMonth, keyUsageProjection, meterHoldsProjection, projections, usageLedgerProjection } from '../../projections/index.ts';
import type { AdapterUnderTest } from '../store/adapters.ts';
import { applyTwice } from '../support/projection-specification.ts';
import { MeterDriver, mixedWorkload, mixedWorkloadPhase1, mixedWorkloadPhase2, newKeyId, type Workload } from '../support/meter-workload.ts';

/** The workload's events in global order (the suite's store also holds earlier tests' events). */
async function eventsOf(store: EventStore, { a, b }: Workload): Promise<RecordedEvent[]> {
  await store.readable();
  const out: RecordedEvent[] = [];
  for (let position = logStart; ; ) {
    const page = await store.readAll(position, 1000);
    if (page.length === 0) return out;
    out.push(...page.filter((e) => e.streamId.includes(a.keyId) || e.streamId.includes(b.keyId)));
    position = page[page.length - 1].globalPosition;
  }
}

/** A projection's table by its qualified name: its helper tables live in the internal schema, off the search_path. */
async function qualified(db: Queryable, table: string): Promise<string> {
  const { rows } = await db.query<{ name: string }>(
    `SELECT format('%I.%I', n.nspname, c.relname) AS name FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
     WHERE c.relname = $1 AND n.nspname IN (current_schema(), left(current_schema() || '_internal', 63))`,
    [table],
  );
  return rows[0]?.name ?? table;
}

/** Every table of every projection, each row as JSON, in a stable order. */
async function snapshot(db: Queryable): Promise<Record<string, unknown[]>> {
  const out: Record<string, unknown[]> = {};
  for (const projection of projections) {
    for (const table of projection.tables) {
      const { rows } = await db.query(`SELECT * FROM ${await qualified(db, table)} t ORDER BY t::text`);
      out[table] = rows.map((r) => JSON.parse(JSON.stringify(r)));
    }
  }
  return out;
}

const counters = (r: { reserved_tokens: number; input_tokens: number; output_tokens: number; requests: number; expired: number; rejected: number }) => [
  r.reserved_tokens,
  r.input_tokens,
  r.output_tokens,
  r.requests,
  r.expired,
  r.rejected,
];

/** The suite on one adapter: each adapter's run is a test file of its own, so the two run side by side. */
export function meterProjectionSuite(adapter: AdapterUnderTest): void {
  const it = suite<{ store: EventStore }>(`meter projections (${adapter.name})`);
  // One store for the suite (opening PGlite is slow); each test starts from empty projection tables.
  it.before(async (context) => {
    context.store = await adapter.open({ pollIntervalMs: 200 });
  });
  it.before.each(async ({ store }) => {
    // the projections' tables, in the analysts' schema and (helper tables) the internal one, which also holds the store's own
    const tables = projections.flatMap((p) => p.tables);
    await store.query(`DROP TABLE IF EXISTS ${[...tables, ...tables.map((t) => internalTable(store, t))].join(', ')} CASCADE`);
    await store.query(`DELETE FROM ${internalTable(store, 'projection_checkpoints')}`);
  });
  it.after(async (context) => {
    await context.store?.close();
    await adapter.cleanup();
  });

  it('a database from before the position guards and the internal schema: init drops the per-stream guard tables, makes one position guard per meter projection and moves the helper tables out of the analysts\' schema', async ({ store }) => {
    await store.query(`CREATE TABLE key_usage_holds (stream_id text COLLATE "C" NOT NULL, request_id text NOT NULL, tokens bigint NOT NULL, PRIMARY KEY (stream_id, request_id))`);
    await store.query(`INSERT INTO key_usage_holds VALUES ('meter-old-2026-01-01', 'r1', 12)`);
    const meterProjections = [keyUsageProjection, usageLedgerProjection, dailySpendProjection, meterHoldsProjection];
    for (const p of meterProjections) await store.query(`CREATE TABLE ${p.name}_applied (stream_id text COLLATE "C" PRIMARY KEY, stream_version bigint NOT NULL)`);
    const runner = new ProjectionRunner({ store, projections });
    await runner.start();
    try {
      const { rows } = await store.query<{ name: string }>(
        `SELECT table_name AS name FROM information_schema.tables WHERE table_schema = left(current_schema() || '_internal', 63) AND (table_name LIKE '%\\_applied' OR table_name LIKE '%\\_position') ORDER BY 1`,
      );
      assert.equal(rows.map((r) => r.name), meterProjections.map((p) => `${p.name}_position`).sort());
      const { rows: home } = await store.query<{ name: string }>(`SELECT table_name AS name FROM information_schema.tables WHERE table_schema = current_schema() ORDER BY 1`);
      assert.equal(home.map((r) => r.name).filter((n) => /_(applied|position|holds|pending)$/.test(n) && n !== 'meter_holds'), [], 'no helper table left in the analysts\' schema');
      const { rows: moved } = await store.query(`SELECT * FROM ${await qualified(store, 'key_usage_holds')}`);
      assert.equal(moved.map((r) => ({ ...r, tokens: Number(r.tokens) })), [{ stream_id: 'meter-old-2026-01-01', request_id: 'r1', tokens: 12 }], 'moved with its rows');
    } finally {
      await runner.stop();
    }
  });

  it('key_usage: month and day rows; a hold carried over the month turn counts once, on its own day; applying twice changes nothing', async ({ store }) => {
    const workload = await mixedWorkload(store);
    const { a, b } = workload;
    const events = await eventsOf(store, workload);
    await applyTwice(store, keyUsageProjection, events, 'SELECT * FROM key_usage t ORDER BY t::text');
    //                                      reserved input output requests expired rejected
    assert.equal((await keyUsageOfMonth(store, a.keyId, '2026-11')).map((r) => [r.period_kind, r.period, ...counters(r)]), [
      ['month', '2026-11', 0, 10 + 5 + 2 + 8, 15 + 10 + 6 + 12, 3, 1, 1],
      ['day', '2026-11-29', 0, 15, 25, 1, 1, 1],
      ['day', '2026-11-30', 0, 10, 18, 2, 0, 0],
    ]);
    // December: r5 settled, r6 still open (4 + 16 held); r4's release on 12-01 charges nothing here.
    assert.equal((await keyUsageOfMonth(store, a.keyId, '2026-12')).map((r) => [r.period_kind, r.period, ...counters(r)]), [
      ['month', '2026-12', 20, 3, 4, 1, 0, 0],
      ['day', '2026-12-01', 20, 3, 4, 1, 0, 0],
    ]);
    assert.equal((await keyUsageOfMonth(store, b.keyId, '2026-11')).map((r) => [r.period_kind, r.period, ...counters(r)]), [
      ['month', '2026-11', 0, 100, 50, 1, 0, 1],
      ['day', '2026-11-30', 0, 100, 50, 1, 0, 1],
    ]);
    // period_start: a month row's first day, a day row's day, as a date
    const { rows: starts } = await store.query(
      `SELECT period_kind, period, to_char(period_start, 'YYYY-MM-DD') AS period_start FROM key_usage WHERE key_id = $1 ORDER BY period`,
      [a.keyId],
    );
    assert.equal(starts.map((r) => [r.period_kind, r.period, r.period_start]), [
      ['month', '2026-11', '2026-11-01'],
      ['day', '2026-11-29', '2026-11-29'],
      ['day', '2026-11-30', '2026-11-30'],
      ['month', '2026-12', '2026-12-01'],
      ['day', '2026-12-01', '2026-12-01'],
    ]);
  });

  it('key_usage from before period_start: init adds the date column, filled in from period, and the rows go on counting', async ({ store }) => {
    await store.query(`CREATE TABLE key_usage (
      key_id text NOT NULL, period_kind text NOT NULL CHECK (period_kind IN ('month', 'day')), period text NOT NULL,
      reserved_tokens bigint NOT NULL DEFAULT 0, input_tokens bigint NOT NULL DEFAULT 0, output_tokens bigint NOT NULL DEFAULT 0,
      requests bigint NOT NULL DEFAULT 0, expired bigint NOT NULL DEFAULT 0, rejected bigint NOT NULL DEFAULT 0,
      PRIMARY KEY (key_id, period_kind, period))`);
    await store.query(`INSERT INTO key_usage (key_id, period_kind, period, requests) VALUES ('0c8190d112da', 'month', '2026-10', 3), ('0c8190d112da', 'day', '2026-10-31', 3)`);
    await store.transaction((tx) => keyUsageProjection.init(tx));
    const { rows } = await store.query(
      `SELECT period, to_char(period_start, 'YYYY-MM-DD') AS period_start, requests::int FROM key_usage ORDER BY period`,
    );
    assert.equal(rows, [
      { period: '2026-10', period_start: '2026-10-01', requests: 3 },
      { period: '2026-10-31', period_start: '2026-10-31', requests: 3 },
    ]);
    const { rows: column } = await store.query(
      `SELECT data_type, is_nullable FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = 'key_usage' AND column_name = 'period_start'`,
    );
    assert.equal(column, [{ data_type: 'date', is_nullable: 'NO' }]);
  });

  it('usage_ledger: one row per settled, expired or rejected request, metadata only; applying twice changes nothing', async ({ store }) => {
    const workload = await mixedWorkload(store);
    const { a } = workload;
    const rows = await applyTwice(
      store,
      usageLedgerProjection,
      await eventsOf(store, workload),
      `SELECT request_id, key_id, key_prefix, email, endpoint, model, user_tag, workload, input_tokens, output_tokens, status, latency_ms, gpu_seconds, cost, cost_micros, basis,
              late_input_tokens, late_output_tokens, outcome, code, disconnected, to_char(day, 'YYYY-MM-DD') AS day, at
       FROM usage_ledger WHERE key_id = '${a.keyId}' ORDER BY at`,
    );
    const brief = rows.map((r) => [String(r.request_id).slice(13), r.outcome, Number(r.input_tokens), Number(r.output_tokens), r.status, r.code, r.day]);
    assert.equal(brief, [
      ['r1', 'settled', 10, 15, 200, null, '2026-11-29'],
      ['r3', 'rejected', 7, 0, 429, 'budget_exceeded', '2026-11-29'],
      ['r2', 'expired', 5, 10, 200, null, '2026-11-29'], // status from its late settlement
      ['r7', 'settled', 2, 6, 200, null, '2026-11-30'],
      ['r5', 'settled', 3, 4, 200, null, '2026-12-01'],
      ['r4', 'settled', 8, 12, 200, null, '2026-11-30'],
    ]);
    // The expired row got its request facts from the reservation.
    const expired = rows.find((r) => r.outcome === 'expired')!;
    assert.equal([expired.key_prefix, expired.email, expired.endpoint, expired.model, expired.user_tag, expired.workload], [a.keyId, a.email, '/v1/completions', 'ref-small', 'analyst-7', 'batch']);
    // Its late settlement filled in the real usage, the GPU time and its cost; the charged tokens stay the whole hold.
    assert.equal(
      [expired.latency_ms, expired.gpu_seconds, expired.cost, Number(expired.cost_micros), expired.basis, expired.disconnected, Number(expired.late_input_tokens), Number(expired.late_output_tokens)],
      [12.5, 0.75, '0.500000', 500_000, 'engine_usage', false, 5, 4],
    );
    const { rows: pending } = await store.query(`SELECT request_id FROM ${await qualified(store, 'usage_ledger_pending')} ORDER BY 1`);
    assert.equal(pending, [{ request_id: `${a.keyId}-r6` }], 'only the open reservation waits for its outcome');
  });

  it('daily_spend: settlements (a late one included) summed exactly per meter day; applying twice changes nothing', async ({ store }) => {
    const workload = await mixedWorkload(store);
    const rows = await applyTwice(
      store,
      dailySpendProjection,
      await eventsOf(store, workload),
      `SELECT to_char(day, 'YYYY-MM-DD') AS day, cost_micros, cost, gpu_seconds, requests FROM daily_spend ORDER BY day`,
    );
    assert.equal(rows.map((r) => ({ ...r, cost_micros: Number(r.cost_micros), requests: Number(r.requests) })), [
      { day: '2026-11-29', cost_micros: 1_750_000, cost: '1.750000', gpu_seconds: 0.5 + 0.75, requests: 2 },
      { day: '2026-11-30', cost_micros: 3_750_000, cost: '3.750000', gpu_seconds: 0.125 + 0.75 + 1, requests: 3 },
      { day: '2026-12-01', cost_micros: 125_000, cost: '0.125000', gpu_seconds: 0.0625, requests: 1 },
    ]);
  });

  it('meter_holds: only open reservations, renewed expiry; the reaper query finds the ones past their TTL', async ({ store }) => {
    const workload = await mixedWorkload(store);
    const { a } = workload;
    const rows = await applyTwice(
      store,
      meterHoldsProjection,
      await eventsOf(store, workload),
      `SELECT request_id, key_id, stream_id, to_char(day, 'YYYY-MM-DD') AS day, input_tokens, output_tokens, reserved_at, expires_at FROM meter_holds ORDER BY request_id`,
    );
    assert.equal(rows.map((r) => [r.request_id, r.key_id, r.stream_id, r.day, Number(r.input_tokens), Number(r.output_tokens)]), [
      [`${a.keyId}-r6`, a.keyId, `meter-${a.keyId}-2026-12-01`, '2026-12-01', 4, 16],
    ]);
    assert.is(new Date(rows[0].expires_at as string).toISOString(), '2026-12-01T00:03:00.000Z', 'renewal moved the expiry');
    assert.equal(await expiredHolds(store, new Date('2026-12-01T00:02:59.000Z')), []);
    assert.equal((await expiredHolds(store, new Date('2026-12-01T00:03:00.000Z'))).map((h) => [h.requestId, h.streamId, h.day]), [[`${a.keyId}-r6`, `meter-${a.keyId}-2026-12-01`, '2026-12-01']]);
  });

  it('svc projections rebuild reproduces every table row for row (catch-up, live, then rebuild)', async ({ store }) => {
    const workload = await mixedWorkloadPhase1(store);
    const runner = new ProjectionRunner({ store, projections, batchSize: 4, pollIntervalMs: 50 });
    await runner.start(); // catch-up over phase 1
    await runner.caughtUp();
    await mixedWorkloadPhase2(workload); // live, in small batches
    await runner.caughtUp();
    const live = await snapshot(store);
    const ours = (rows: unknown[]) => rows.filter((r) => [workload.a.keyId, workload.b.keyId].includes((r as { key_id: string }).key_id)).length;
    assert.equal([ours(live.key_usage), ours(live.usage_ledger), live.daily_spend.length, ours(live.meter_holds)], [7, 8, 3, 1]);
    await runner.stop();
    let out = '';
    const io = { store, projections, stdout: { write: (t: string) => (out += t) }, stderr: { write: () => true } };
    assert.is(await runProjectionsCommand(['rebuild'], io), 0);
    for (const p of projections) assert.match(out, `rebuilt ${p.name}:`);
    assert.equal(await snapshot(store), live);
    // and a rebuild in one-event batches (every event its own transaction) lands on the same rows
    const small = new ProjectionRunner({ store, projections, rebuildBatchSize: 1 });
    for (const name of small.names) await small.rebuild(name);
    assert.equal(await snapshot(store), live);
  });

  it('any cut of the log into batches gives the rows of one event at a time, request ids reused included', async ({ store }) => {
    // Two keys, seeded random traffic through the real decider: holds made and closed in one batch or
    // across batches, renewed, expired, and request ids reused once their hold closed (a client's
    // X-Request-Id), so a batch can close one hold and open another under the same id.
    let seed = 20261125;
    const random = () => {
      seed = (seed + 0x6d2b79f5) | 0;
      let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
      t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
    const day = '2026-11-29';
    const drivers = [new MeterDriver(store, newKeyId()), new MeterDriver(store, newKeyId())];
    let now = Date.parse(`${day}T10:00:00.000Z`);
    const at = () => new Date((now += 1000)).toISOString();
    const open = drivers.map(() => new Map<string, number>()); // request id -> expires at (ms)
    for (const driver of drivers) {
      await driver.issue(at());
      await driver.open(day, at());
    }
    for (let step = 0; step < 160; step++) {
      const k = Math.floor(random() * drivers.length);
      const [driver, holds] = [drivers[k], open[k]];
      const roll = random();
      const ids = [...holds.keys()];
      const id = ids[Math.floor(random() * ids.length)];
      if (ids.length === 0 || (roll < 0.4 && ids.length < 4)) {
        const free = [0, 1, 2, 3, 4, 5].map((n) => `${driver.keyId}-q${n}`).filter((q) => !holds.has(q));
        const request = free[Math.floor(random() * free.length)];
        await driver.reserve(day, request, 1 + Math.floor(random() * 50), 1 + Math.floor(random() * 50), at(), 3000);
        holds.set(request, now + 3000);
      } else if (roll < 0.75) {
        // GPU time and cost with no short binary form: their float sums depend on the order of the additions
        await driver.settle(day, id, 1 + Math.floor(random() * 50), Math.floor(random() * 50), at(), random() * 0.3, random() * 0.7);
        holds.delete(id);
      } else if (roll < 0.85 && holds.get(id)! <= now + 1000) {
        await driver.expire(day, id, at());
        holds.delete(id);
        // Sometimes its process was alive after all: a late settlement, recorded beside the expiry.
        if (random() < 0.5) await driver.settle(day, id, 1 + Math.floor(random() * 50), Math.floor(random() * 50), at(), random() * 0.3, random() * 0.7);
      } else if (roll < 0.95) {
        const expires = holds.get(id)! + 10_000;
        await driver.renew(day, id, new Date(expires).toISOString(), at());
        holds.set(id, expires);
      } else {
        await driver.reject(day, `${driver.keyId}-x${step}`, 'rate_limited', 429, 3, at());
      }
    }
    const mine = (rows: unknown[]) => rows.filter((r) => drivers.some((d) => JSON.stringify(r).includes(d.keyId)));
    // daily_spend sums every key of the log (earlier tests' too): whole
    const tables = async () => Object.fromEntries(Object.entries(await snapshot(store)).map(([table, rows]) => [table, table === 'daily_spend' ? rows : mine(rows)]));
    const runner = (rebuildBatchSize: number) => new ProjectionRunner({ store, projections, rebuildBatchSize });
    // Every rebuild reads the whole workload: a transaction of another test on the same server can hold it back from readers until it ends
    await store.readable();
    const one = runner(1);
    for (const name of one.names) await one.rebuild(name);
    const reference = await tables();
    assert.equal([reference.key_usage.length, reference.usage_ledger.length > 12], [4, true], 'the workload reached the tables');
    for (const size of [2, 3, 5, 8, 13, 1000]) {
      const cut = runner(size);
      for (const name of cut.names) await cut.rebuild(name);
      assert.equal(await tables(), reference, `batches of ${size}`);
    }
    // Batches replayed over what was applied before, so that each one's guard falls inside it (a close
    // whose reservation is in the batch but was applied earlier must still remove its hold): the same rows.
    const log: RecordedEvent[] = [];
    for (let position = logStart; ; ) {
      const page = await store.readAll(position, 1000);
      if (page.length === 0) break;
      log.push(...page);
      position = page[page.length - 1].globalPosition;
    }
    for (const [size, step] of [[6, 4], [13, 5], [40, 3]]) {
      const names = projections.flatMap((p) => p.tables);
      await store.query(`DROP TABLE IF EXISTS ${[...names, ...names.map((t) => internalTable(store, t))].join(', ')} CASCADE`);
      for (const projection of projections) {
        await store.transaction((tx) => projection.init(tx));
        const wanted = new Set(projection.eventTypes);
        const events = log.filter((e) => wanted.has(e.type));
        for (let from = 0; from < events.length; from += step) {
          await store.transaction((tx) => projection.apply(events.slice(from, from + size), tx));
        }
      }
      assert.equal(await tables(), reference, `batches of ${size} overlapping by ${size - step}`);
    }
  });

  it.run();
}
