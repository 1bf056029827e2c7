/**
 * The spend watcher after priced settlements (SVC_DAILY_SPEND_CAP): the day's spend is read from the
 * daily_spend projection once per round trip, not once per settlement, and a read that fails is logged,
 * never thrown where nothing waits for it (an unhandled rejection ends a Node process). A real
 * in-memory store; its `query` is counted, or made to fail for daily_spend the way a dropped connection
 * fails it.
 */
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import pino from 'pino';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { Metering, type Usage } from '../../src/metering/index.ts';
import { ProjectionRunner, WorkflowProcessor } from '../../src/processors/index.ts';
import { dailySpendProjection } from '../../projections/index.ts';
import { until } from '../support/until.ts';
import type { EventStore } from '../../src/store/index.ts';
import { admitRequest } from '../support/admit-request.ts';
import { meteringSuite } from '../support/metering-suite.ts';

const it = meteringSuite('metering: the spend check after priced settlements');

const priced: Usage = { inputTokens: 5, outputTokens: 8, status: 200, latencyMs: 3, gpuSeconds: 0.01, costMicros: 10_000, pricePerGpuSecondMicros: 1_000_000, basis: 'engine_usage', disconnected: false };

/** The store, its reads of daily_spend counted (`reads`) or, with `failing`, refused like a broken connection. */
function watched(store: EventStore, failing: boolean): { store: EventStore; reads: () => number } {
  let reads = 0;
  return {
    reads: () => reads,
    store: {
      ...store,
      async query(sql, params) {
        if (sql.includes('FROM daily_spend')) {
          reads++;
          if (failing) throw new Error('Connection terminated unexpectedly');
        }
        return store.query(sql, params);
      },
    },
  };
}

/** Admits and settles `n` requests on `keyId` at once, priced; resolves when every settlement is stored. */
async function settleAtOnce(metering: Metering, keyId: string, n: number): Promise<void> {
  const requests = Array.from({ length: n }, () => admitRequest(keyId));
  const admissions = await Promise.all(requests.map((r) => metering.admit(r)));
  await Promise.all(admissions.map((a) => a.durable));
  await Promise.all(admissions.map((a, i) => metering.settle(a, requests[i].facts, priced)));
}

it('sixteen settlements at once read the day spend a few times, not sixteen', async ({ store }) => {
  const spend = watched(store, false);
  const metering = new Metering({ handler: new CommandHandler({ store }), store: spend.store, logger: pino({ level: 'silent' }), reservationTtlMs: 60_000, dailySpendCap: 1_000 });
  await settleAtOnce(metering, randomUUID().slice(0, 12), 16);
  await metering.stop(); // waits for the checks under way
  assert.ok(spend.reads() >= 1, 'the spend is checked after priced settlements');
  assert.ok(spend.reads() <= 4, `one check, and one more for the settlements during it: ${spend.reads()} reads`);
});

it('a spend check that fails is logged and the process goes on', async ({ store }) => {
  const spend = watched(store, true);
  const logged: string[] = [];
  const logger = pino({ level: 'error' }, { write: (line: string) => void logged.push(JSON.parse(line).msg) });
  const metering = new Metering({ handler: new CommandHandler({ store }), store: spend.store, logger, reservationTtlMs: 60_000, dailySpendCap: 1_000 });
  const unhandled: unknown[] = [];
  const onUnhandled = (reason: unknown) => void unhandled.push(reason);
  process.on('unhandledRejection', onUnhandled);
  try {
    await settleAtOnce(metering, randomUUID().slice(0, 12), 4);
    await metering.stop();
    await new Promise((resolve) => setImmediate(resolve));
  } finally {
    process.off('unhandledRejection', onUnhandled);
  }
  assert.ok(spend.reads() >= 1);
  assert.equal(unhandled, [], 'no rejection left unhandled');
  assert.ok(logged.includes('spend check failed'), logged.join(' | '));
});

it("the spend watcher's tick, run by the workflow processor, pauses a process that settled nothing itself once the day's spend reaches the cap", async ({ store, meterings }) => {
  const runner = new ProjectionRunner({ store, projections: [dailySpendProjection], pollIntervalMs: 50 });
  await runner.start();
  // Another process (no cap of its own) settles priced requests; this one, capped, only ticks.
  const other = new Metering({ handler: new CommandHandler({ store }), store, logger: pino({ level: 'silent' }), reservationTtlMs: 60_000, dailySpendCap: null });
  const capped = new Metering({ handler: new CommandHandler({ store }), store, logger: pino({ level: 'silent' }), reservationTtlMs: 60_000, dailySpendCap: 0.005, sweepIntervalMs: 50 });
  meterings.push(other, capped);
  const timers = capped.timers();
  assert.equal(timers.workflows.map((w) => w.name), ['hold-reaper', 'spend-watcher']);
  const processor = new WorkflowProcessor({ store, handler: new CommandHandler({ store }), ...timers, idleCheckpointMs: 50 });
  await processor.start();
  try {
    const keyId = randomUUID().slice(0, 12);
    await settleAtOnce(other, keyId, 1);
    await until('the capped process refusing with spend_cap', async () => {
      try {
        const admission = await capped.admit(admitRequest(keyId));
        await admission.durable;
        return false;
      } catch (error) {
        return (error as { code?: string }).code === 'spend_cap';
      }
    }, 10_000, 25);
  } finally {
    await processor.stop();
    await runner.stop();
  }
});

it.run();
