/**
 * Metering when the store fails for a moment: a reservation whose append outcome is unknown is
 * released at zero usage (not left to the reaper, which would charge it whole), and a settlement the
 * store refused is tried again until it is stored with the real usage. A real (in-memory) store, with
 * appends made to fail the way a broken connection fails them.
 */
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import pino from 'pino';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { Metering } from '../../src/metering/index.ts';
import { ApiError } from '../../src/errors/index.ts';
import type { EventStore } from '../../src/store/index.ts';
import { meterEvents, meterStream, utcDay, type MeterEvent } from '../../events/meter.ts';
import { until } from '../support/until.ts';
import { admitRequest } from '../support/admit-request.ts';
import { meteringSuite } from '../support/metering-suite.ts';

const it = meteringSuite('metering when the store fails for a moment');

/** Appends carrying an event of `type` fail `times` times; `stored`: the failed append did reach the store (its answer was lost). */
function failing(store: EventStore, type: string, times: number, stored: boolean): EventStore {
  let left = times;
  return {
    ...store,
    async append(streamId, events, expected) {
      if (left > 0 && events.some((e) => e.type === type)) {
        left--;
        if (stored) await store.append(streamId, events, expected);
        throw new Error('Connection terminated unexpectedly');
      }
      return store.append(streamId, events, expected);
    },
  };
}

const request = (keyId: string) => admitRequest(keyId, { budgets: { monthly_token_budget: 1000 }, maxTokens: 100, email: 'f@example.org' });

async function meterOf(store: EventStore, keyId: string): Promise<MeterEvent[]> {
  return (await store.readStream(meterStream(keyId, utcDay(new Date())))).events.map((e) => meterEvents.parse(e));
}

function meteringOn(store: EventStore): Metering {
  const handler = new CommandHandler({ store });
  return new Metering({ handler, store, logger: pino({ level: 'silent' }), reservationTtlMs: 60_000, dailySpendCap: null });
}

it('a reservation stored but unacknowledged is answered store_unavailable and released at zero usage', async ({ store }) => {
  const keyId = randomUUID().slice(0, 12);
  // The first append and both resends of it are stored, their answers lost.
  const metering = meteringOn(failing(store, 'BudgetReserved', 3, true));
  const admission = await metering.admit(request(keyId));
  try {
    await admission.durable;
    assert.unreachable('the reservation was confirmed');
  } catch (error) {
    assert.instance(error, ApiError);
    assert.is((error as ApiError).code, 'store_unavailable');
  }
  await until('the hold released', async () => (await meterOf(store, keyId)).some((e) => e.type === 'UsageSettled'), 5_000, 25);
  const events = await meterOf(store, keyId);
  assert.equal(events.map((e) => e.type), ['MeterOpened', 'SlotsLeased', 'BudgetReserved', 'UsageSettled']);
  const settled = events[3];
  assert.ok(settled.type === 'UsageSettled' && settled.data.input_tokens === 0 && settled.data.output_tokens === 0 && settled.data.status === 503);
  await metering.stop();
});

it('a settlement the store refused is tried again and stored with the real usage', async ({ store }) => {
  const keyId = randomUUID().slice(0, 12);
  // More failures than the handler's own resends: the settlement fails once, then succeeds on a later try.
  const metering = meteringOn(failing(store, 'UsageSettled', 4, false));
  const req = request(keyId);
  const admission = await metering.admit(req);
  await admission.durable;
  await metering.settle(admission, req.facts, { inputTokens: 5, outputTokens: 42, status: 200, latencyMs: 3, gpuSeconds: 0.01, costMicros: 0, pricePerGpuSecondMicros: 0, basis: 'engine_usage' as const, disconnected: false });
  const events = await meterOf(store, keyId);
  assert.equal(events.map((e) => e.type), ['MeterOpened', 'SlotsLeased', 'BudgetReserved', 'UsageSettled']);
  const settled = events[3];
  assert.ok(settled.type === 'UsageSettled' && settled.data.output_tokens === 42, 'the real usage, not the whole hold');
  await metering.stop();
});

it.run();
