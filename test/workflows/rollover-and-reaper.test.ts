/**
 * The day rollover and the reaper, killed between two of their steps: the next process finishes the
 * work from what the log says, and nothing is done twice. The real Metering, command handler,
 * projection runner (the reaper reads meter_holds) and store (PGlite, and PostgreSQL when
 * DATABASE_URL is set), a clock the test moves.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import pino from 'pino';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { Metering } from '../../src/metering/index.ts';
import { ProjectionRunner, WorkflowProcessor } from '../../src/processors/index.ts';
import { meterHoldsProjection } from '../../projections/index.ts';
import { meterDecider } from '../../deciders/meter.ts';
import { meterEvents, meterStream, type MeterEvent } from '../../events/meter.ts';
import type { EventStore } from '../../src/store/index.ts';
import { adaptersUnderTest } from '../store/adapters.ts';
import { admitRequest } from '../support/admit-request.ts';
import { until } from '../support/until.ts';
import { within } from '../support/within.ts';

const ttlMs = 60_000;
const D = '2026-11-24';
const D1 = '2026-11-25';

function metering(store: EventStore, clock: { now: Date }, handler = new CommandHandler({ store })) {
  return new Metering({ handler, store, logger: pino({ level: 'silent' }), reservationTtlMs: ttlMs, dailySpendCap: null, sweepIntervalMs: 50, now: () => clock.now });
}

/** The reaper of a process: its metering's timers, driven by a workflow processor on the test's clock. */
async function reaperOf(store: EventStore, clock: { now: Date }, meter: Metering): Promise<WorkflowProcessor> {
  const { workflows, deliver } = meter.timers();
  const processor = new WorkflowProcessor({ store, handler: new CommandHandler({ store }), workflows, deliver, now: () => clock.now, idleCheckpointMs: 50, pollIntervalMs: 100 });
  await processor.start();
  return processor;
}

async function typesOn(store: EventStore, keyId: string, day: string): Promise<MeterEvent[]> {
  return (await store.readStream(meterStream(keyId, day))).events.map((e) => meterEvents.parse(e));
}

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore }>(`rollover and reaper across a crash (${adapter.name})`);
  it.before(async (context) => {
    context.store = await adapter.open({ pollIntervalMs: 100 });
  });
  it.after(async (context) => {
    await context.store?.close();
    await adapter.cleanup();
  });

  it('a process that died between closing day D and opening D + 1: the next reservation opens D + 1 from the closed D, closing nothing twice', async ({ store }) => {
    const keyId = randomUUID().slice(0, 12);
    const clock = { now: new Date(`${D}T23:59:50Z`) };
    const first = metering(store, clock);
    const running = await first.admit(admitRequest(keyId));
    await running.durable;
    clock.now = new Date(`${D1}T00:00:05Z`);
    // The opener's first step, then death.
    const handler = new CommandHandler({ store });
    assert.ok((await handler.handle(meterStream(keyId, D), { type: 'CloseMeter', nextDay: D1, now: clock.now.toISOString() }, meterDecider)).accepted);
    await first.stop();

    const second = metering(store, clock);
    const next = await second.admit(admitRequest(keyId));
    await next.durable;
    assert.is(next.day, D1);
    const opened = (await typesOn(store, keyId, D1))[0];
    assert.is(opened.type, 'MeterOpened');
    const opening = (opened as Extract<MeterEvent, { type: 'MeterOpened' }>).data;
    assert.is(opening.carried_from, D);
    assert.equal(opening.carried_holds.map((h) => h.request_id), [running.requestId], "D's running hold carried");
    assert.is((await typesOn(store, keyId, D)).filter((e) => e.type === 'MeterClosed').length, 1, 'D closed once');
    await second.stop();
  });

  it('a reaper that died between two expiries: the next one expires the rest, each hold once', async ({ store }) => {
    const keyId = randomUUID().slice(0, 12);
    const clock = { now: new Date(`${D}T12:00:00Z`) };
    const runner = new ProjectionRunner({ store, projections: [meterHoldsProjection], pollIntervalMs: 100 });
    await runner.start();
    // Two requests whose process died: nobody settles them.
    const dead = metering(store, clock);
    const holds = [await dead.admit(admitRequest(keyId)), await dead.admit(admitRequest(keyId))];
    for (const h of holds) await h.durable;
    await within(10_000, runner.caughtUp(), 'meter_holds catching up');
    clock.now = new Date(Date.parse(`${D}T12:00:00Z`) + ttlMs + 1_000);

    // A reaper whose process dies after its first expiry.
    let expiries = 0;
    const dyingHandler = new Proxy(new CommandHandler({ store }), {
      get(target, property, receiver) {
        if (property === 'handle') {
          return (...args: Parameters<CommandHandler['handle']>) =>
            (args[1] as { type: string }).type === 'Expire' && expiries++ >= 1 ? Promise.reject(new Error('killed mid-sweep')) : target.handle(...args);
        }
        const value = Reflect.get(target, property, receiver);
        return typeof value === 'function' ? value.bind(target) : value;
      },
    });
    const dying = metering(store, clock, dyingHandler);
    dying.start();
    const dyingReaper = await reaperOf(store, clock, dying);
    // Time passes (the reaper's ticks come a period apart) while the test waits.
    const passing = () => void (clock.now = new Date(clock.now.getTime() + 25));
    await until('the dying reaper expiring one hold', async () => (passing(), (await typesOn(store, keyId, D)).some((e) => e.type === 'ReservationExpired')), 10_000, 20);
    await dyingReaper.stop();
    await dying.stop();
    assert.is((await typesOn(store, keyId, D)).filter((e) => e.type === 'ReservationExpired').length, 1, 'one expired before the crash');

    await within(10_000, runner.caughtUp(), 'meter_holds catching up');
    const next = metering(store, clock);
    next.start();
    const nextReaper = await reaperOf(store, clock, next);
    await until('the next reaper expiring the other', async () => (passing(), (await typesOn(store, keyId, D)).filter((e) => e.type === 'ReservationExpired').length === 2), 10_000, 20);
    clock.now = new Date(clock.now.getTime() + 1_000);
    await new Promise((r) => setTimeout(r, 300)); // more ticks: nothing more is expired
    await nextReaper.stop();
    await next.stop();
    const expired = (await typesOn(store, keyId, D)).filter((e) => e.type === 'ReservationExpired').map((e) => (e.data as { request_id: string }).request_id);
    assert.equal(expired.sort(), holds.map((h) => h.requestId).sort(), 'each hold expired once');
    await runner.stop();
  });

  it.run();
}
