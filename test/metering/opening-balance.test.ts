/**
 * A key's first request of a UTC day opens that day's meter with the month-to-date balance of the key's
 * latest earlier meter day (found among the last 31 in one read), closes that day, and carries its
 * open holds; at a month's turn the tokens start again from zero. A real (in-memory) store, the real
 * Metering, a clock the test moves.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import pino from 'pino';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { Metering } from '../../src/metering/index.ts';
import { openEventStore, type EventStore } from '../../src/store/index.ts';
import { meterEvents, meterStream, type MeterEvent } from '../../events/meter.ts';
import { admitRequest } from '../support/admit-request.ts';

const it = suite<{ store: EventStore }>('the day meter opening balance');
it.before.each(async (context) => {
  context.store = await openEventStore({ inMemory: true });
});
it.after.each(async ({ store }) => {
  await store.close();
});

const request = (keyId: string) => admitRequest(keyId, { budgets: { monthly_token_budget: 10_000 }, maxTokens: 50 });

async function meterOf(store: EventStore, keyId: string, day: string): Promise<MeterEvent[]> {
  return (await store.readStream(meterStream(keyId, day))).events.map((e) => meterEvents.parse(e));
}

/** One request of 5 prompt and `output` completion tokens, reserved and settled at the clock's time. */
async function served(metering: Metering, keyId: string, output: number): Promise<void> {
  const req = request(keyId);
  const admission = await metering.admit(req);
  await admission.durable;
  await metering.settle(admission, req.facts, { inputTokens: 5, outputTokens: output, status: 200, latencyMs: 1, gpuSeconds: 0, costMicros: 0, pricePerGpuSecondMicros: 0, basis: 'engine_usage' as const, disconnected: false });
}

it('opens with the latest earlier day of the month (days apart), closes it and carries an open hold', async ({ store }) => {
  const keyId = randomUUID().slice(0, 12);
  let now = new Date('2026-11-03T10:00:00Z');
  const metering = new Metering({ handler: new CommandHandler({ store }), store, logger: pino({ level: 'silent' }), reservationTtlMs: 600_000, dailySpendCap: null, now: () => now });
  await served(metering, keyId, 20);
  await served(metering, keyId, 10);
  const open = await metering.admit(request(keyId)); // still running when the day turns
  await open.durable;
  now = new Date('2026-11-09T08:00:00Z'); // five days without a request in between
  await served(metering, keyId, 7);

  const opened = (await meterOf(store, keyId, '2026-11-09'))[0];
  assert.is(opened.type, 'MeterOpened');
  const opening = (opened as Extract<MeterEvent, { type: 'MeterOpened' }>).data;
  assert.is(opening.carried_from, '2026-11-03');
  assert.is(opening.month_input_tokens, 10, 'the settled requests of the 3rd, not the open hold');
  assert.is(opening.month_output_tokens, 30);
  assert.equal(opening.carried_holds.map((h) => h.request_id), [open.requestId]);
  const earlier = await meterOf(store, keyId, '2026-11-03');
  assert.is(earlier[earlier.length - 1].type, 'MeterClosed', 'the earlier day is closed before its balance is read');
  await metering.stop();
});

it("a new month starts from zero tokens but still carries the last month's open holds", async ({ store }) => {
  const keyId = randomUUID().slice(0, 12);
  let now = new Date('2026-10-30T23:00:00Z');
  const metering = new Metering({ handler: new CommandHandler({ store }), store, logger: pino({ level: 'silent' }), reservationTtlMs: 600_000, dailySpendCap: null, now: () => now });
  await served(metering, keyId, 40);
  const open = await metering.admit(request(keyId));
  await open.durable;
  now = new Date('2026-11-02T00:30:00Z');
  await served(metering, keyId, 3);
  const opening = ((await meterOf(store, keyId, '2026-11-02'))[0] as Extract<MeterEvent, { type: 'MeterOpened' }>).data;
  assert.is(opening.carried_from, '2026-10-30');
  assert.is(opening.month_input_tokens, 0);
  assert.is(opening.month_output_tokens, 0);
  assert.equal(opening.carried_holds.map((h) => h.request_id), [open.requestId]);
  await metering.stop();
});

it('a key with no meter in the last 31 days opens at zero, carried from nothing', async ({ store }) => {
  const keyId = randomUUID().slice(0, 12);
  let now = new Date('2026-09-01T12:00:00Z');
  const metering = new Metering({ handler: new CommandHandler({ store }), store, logger: pino({ level: 'silent' }), reservationTtlMs: 600_000, dailySpendCap: null, now: () => now });
  await served(metering, keyId, 5);
  now = new Date('2026-10-03T12:00:00Z'); // 32 days later
  await served(metering, keyId, 5);
  const opening = ((await meterOf(store, keyId, '2026-10-03'))[0] as Extract<MeterEvent, { type: 'MeterOpened' }>).data;
  assert.is(opening.carried_from, null);
  assert.is(opening.month_input_tokens, 0);
  await metering.stop();
});

it.run();
