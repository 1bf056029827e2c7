/**
 * A hold carried over midnight is released on the day that carried it, by the carried-holds workflow
 * driven from the log, whatever dies when: the real Metering, command handler and workflow processor
 * on a real store (PGlite always, PostgreSQL when DATABASE_URL is set), a clock the test moves.
 *
 * The two leaks these tests hold shut: a process that died between a settlement and the release of
 * its carried hold, and a settlement that landed between the close of its day and the opening of the
 * next. Either left the hold on the next day for good, keeping one of the key's 16 active slots.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import pino from 'pino';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { Metering, type Admission, type AdmitRequest } from '../../src/metering/index.ts';
import { WorkflowProcessor } from '../../src/processors/index.ts';
import { carriedHoldsWorkflow } from '../../workflows/carried-holds.ts';
import { activeSlots, balanceFrom, meterDecider } from '../../deciders/meter.ts';
import { meterStream } from '../../events/meter.ts';
import { workflowStream } from '../../src/event-sourcing/index.ts';
import type { EventLog, EventStore } from '../../src/store/index.ts';
import type { ProcessorSources } from '../../src/processors/index.ts';
import { adaptersUnderTest } from '../store/adapters.ts';
import { admitRequest } from '../support/admit-request.ts';
import { within } from '../support/within.ts';
import { until } from '../support/until.ts';

const ttlMs = 60_000;
const D = '2026-11-24';
const D1 = '2026-11-25';
const usage = { inputTokens: 5, outputTokens: 9, status: 200, latencyMs: 1, gpuSeconds: 0, costMicros: 0, pricePerGpuSecondMicros: 0, basis: 'engine_usage' as const, disconnected: false };

/** One gateway process's metering parts on the shared store, on a clock the test moves. */
function gatewayProcess(store: EventStore, clock: { now: Date }, sources: ProcessorSources = { store }, handlerOf?: (h: CommandHandler) => CommandHandler) {
  const handler = new CommandHandler({ store });
  const metering = new Metering({ handler, store, logger: pino({ level: 'silent' }), reservationTtlMs: ttlMs, dailySpendCap: null, now: () => clock.now });
  const errors: unknown[] = [];
  const processor = new WorkflowProcessor({ ...sources, handler: handlerOf ? handlerOf(handler) : handler, workflows: [carriedHoldsWorkflow], pollIntervalMs: 100, onError: (_w, e) => errors.push(e) });
  return { handler, metering, processor, errors };
}

async function admitted(metering: Metering, request: AdmitRequest): Promise<Admission> {
  const admission = await metering.admit(request);
  await admission.durable;
  return admission;
}

async function meterOf(store: EventStore, keyId: string, day: string) {
  const { state } = await new CommandHandler({ store }).load(meterStream(keyId, day), meterDecider, { fresh: true });
  return state;
}

async function releasesOn(store: EventStore, keyId: string, day: string): Promise<number> {
  return (await store.readStream(meterStream(keyId, day))).events.filter((e) => e.type === 'CarriedHoldReleased').length;
}

/** Day D's requests (X, ...) still run at midnight; D+1 opens carrying them (a request there); they then settle on D. */
async function carriedThenSettled(store: EventStore, clock: { now: Date }, keyId: string, running = 1) {
  const first = gatewayProcess(store, clock);
  clock.now = new Date(`${D}T23:59:50Z`);
  const carried = Array.from({ length: running }, () => admitRequest(keyId));
  const admissions = [];
  for (const request of carried) admissions.push(await admitted(first.metering, request));
  clock.now = new Date(`${D1}T00:00:10Z`);
  const y = admitRequest(keyId);
  await first.metering.settle(await admitted(first.metering, y), y.facts, usage);
  const opened = await meterOf(store, keyId, D1);
  for (const request of carried) assert.ok(opened.holds.get(request.facts.request_id), 'the next day carried the running hold');
  for (const [i, request] of carried.entries()) await first.metering.settle(admissions[i], request.facts, usage);
  return { first, x: carried[0] };
}

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore }>(`carried holds released by the workflow (${adapter.name})`);
  it.before(async (context) => {
    context.store = await adapter.open({ pollIntervalMs: 100 });
  });
  it.after(async (context) => {
    await context.store?.close();
    await adapter.cleanup();
  });

  it('a process that died between the settlement and the release: another one releases the hold, and the slot is free after the TTL', async ({ store }) => {
    const keyId = randomUUID().slice(0, 12);
    const clock = { now: new Date() };
    const { first, x } = await carriedThenSettled(store, clock, keyId);
    await first.metering.stop(); // died: nothing of it runs on (it ran no workflow processor at all)

    clock.now = new Date(Date.parse(`${D1}T00:00:10Z`) + ttlMs + 1_000);
    const second = gatewayProcess(store, clock);
    await second.processor.start();
    await within(10_000, second.processor.caughtUp(), 'the workflow catching up');
    const state = await meterOf(store, keyId, D1);
    assert.is(state.holds.get(x.facts.request_id), undefined, 'the carried hold is released on the next day');
    assert.is(activeSlots(state, clock.now.getTime()), 0, "none of the key's active slots is taken");
    assert.is(state.monthOutput, 18, 'both requests charged once on the month');
    assert.is(await releasesOn(store, keyId, D1), 1);
    await second.processor.stop();
    assert.equal(second.errors, []);
  });

  it('a settlement that lands between the close of its day and the opening of the next: released once the next day opens carrying it', async ({ store }) => {
    const keyId = randomUUID().slice(0, 12);
    const clock = { now: new Date(`${D}T23:59:50Z`) };
    const gateway = gatewayProcess(store, clock);
    await gateway.processor.start();
    const x = admitRequest(keyId);
    const xAdmission = await admitted(gateway.metering, x);
    clock.now = new Date(`${D1}T00:00:01Z`);
    // The opener of D+1 closes D and reads its balance (X open) ...
    const closed = await gateway.handler.handle(meterStream(keyId, D), { type: 'CloseMeter', nextDay: D1, now: clock.now.toISOString() }, meterDecider);
    assert.ok(closed.accepted);
    // ... X settles on D meanwhile (the release finds no D+1 to release it on) ...
    await gateway.metering.settle(xAdmission, x.facts, usage);
    await within(10_000, gateway.processor.caughtUp(), 'the workflow seeing the settlement');
    // ... and D+1 opens carrying X.
    const opening = balanceFrom(keyId, D1, D, closed.state, clock.now.getTime());
    assert.equal(opening.carried_holds.map((h) => h.request_id), [x.facts.request_id]);
    await gateway.handler.handle(meterStream(keyId, D1), { type: 'OpenMeter', opening, now: clock.now.toISOString() }, meterDecider);
    await within(10_000, gateway.processor.caughtUp(), 'the workflow seeing the opening');

    clock.now = new Date(Date.parse(`${D1}T00:00:01Z`) + ttlMs + 1_000);
    const state = await meterOf(store, keyId, D1);
    assert.is(state.holds.get(x.facts.request_id), undefined, 'the carried hold is released on the next day');
    assert.is(activeSlots(state, clock.now.getTime()), 0);
    assert.is(await releasesOn(store, keyId, D1), 1);
    await gateway.processor.stop();
    await gateway.metering.stop();
    assert.equal(gateway.errors, []);
  });

  // The processor's steps for a batch: decide, send each command, record the messages and move the
  // checkpoint. A process dying before any of them, between two sends, or before the commit is
  // replaced by one that resumes from the checkpoint: each release lands once, each input is recorded once.
  for (const crash of ['before the first command', 'between two commands', 'after the commands, before the commit'] as const) {
    it(`a processor that dies ${crash}: the next one resumes from the checkpoint, without losing or doubling a step`, async ({ store }) => {
      const keyId = randomUUID().slice(0, 12);
      const clock = { now: new Date() };
      // Two holds carried: the settlement of each releases it; one batch holds both settlements.
      const { first: gateway } = await carriedThenSettled(store, clock, keyId, 2);

      const sendsBeforeDeath = crash === 'before the first command' ? 0 : crash === 'between two commands' ? 1 : Infinity;
      let sends = 0;
      const dying = gatewayProcess(
        store,
        clock,
        { store: new Proxy(store, {
          get(target, property, receiver) {
            if (property === 'transaction' && crash === 'after the commands, before the commit') return async () => Promise.reject(new Error('killed before the commit'));
            const value = Reflect.get(target, property, receiver);
            return typeof value === 'function' ? value.bind(target) : value;
          },
        }) },
        (handler) =>
          new Proxy(handler, {
            get(target, property, receiver) {
              if (property === 'handle') {
                return (...args: Parameters<CommandHandler['handle']>) => (sends++ < sendsBeforeDeath ? target.handle(...args) : Promise.reject(new Error('killed while sending')));
              }
              const value = Reflect.get(target, property, receiver);
              return typeof value === 'function' ? value.bind(target) : value;
            },
          }),
      );
      await dying.processor.start();
      await until('the processor dying', async () => dying.errors.length > 0, 10_000, 20);
      await dying.processor.stop();
      const releasedBefore = await releasesOn(store, keyId, D1);
      if (sendsBeforeDeath === Infinity) {
        // Its first batch's commands, all sent: both settlements, or only the first where the reader
        // handed the second over in a batch of its own (a loaded PostgreSQL can).
        assert.ok(releasedBefore >= 1 && releasedBefore <= 2, `what the dead processor sent before it died: ${releasedBefore}`);
      } else assert.is(releasedBefore, sendsBeforeDeath, 'what the dead processor sent before it died');

      const next = gatewayProcess(store, clock);
      await next.processor.start();
      await within(10_000, next.processor.caughtUp(), 'the next processor catching up');
      const state = await meterOf(store, keyId, D1);
      assert.is(state.holds.size, 0, 'both carried holds released');
      assert.is(await releasesOn(store, keyId, D1), 2, 'each released once');
      const recorded = (await store.readStream(workflowStream(carriedHoldsWorkflow.name, keyId))).events;
      assert.equal(
        recorded.map((e) => e.type),
        ['WorkflowInputRecorded', 'WorkflowInputRecorded', 'WorkflowCommandSent', 'WorkflowInputRecorded', 'WorkflowCommandSent'],
        'the opening, then each settlement with its release, once',
      );
      await next.processor.stop();
      await gateway.metering.stop();
      assert.equal(next.errors, []);
    });
  }

  // A log apart from the database (here the same store seen as two objects) cannot record and move the
  // checkpoint in one transaction: the processor records first, so a death between the two leaves
  // inputs recorded past the checkpoint, and the next one must pass over them.
  it('a log apart from the database, a processor that dies after recording, before moving the checkpoint: the next one passes over what it recorded', async ({ store }) => {
    const keyId = randomUUID().slice(0, 12);
    const clock = { now: new Date() };
    const { first: gateway } = await carriedThenSettled(store, clock, keyId, 2);

    const logApart = (): EventLog => ({ ...store });
    const recordedTypes = async () => (await store.readStream(workflowStream(carriedHoldsWorkflow.name, keyId))).events.map((e) => e.type);
    const expected = ['WorkflowInputRecorded', 'WorkflowInputRecorded', 'WorkflowCommandSent', 'WorkflowInputRecorded', 'WorkflowCommandSent'];
    const dying = gatewayProcess(store, clock, {
      log: logApart(),
      db: { ...store, transaction: () => Promise.reject(new Error('killed before the checkpoint moved')) },
    });
    await dying.processor.start();
    // Another error can come first (an idle checkpoint move, a lease renewal on a loaded database):
    // wait for the batch's records too, which its failing commit retries without appending them again.
    await until('the processor recording, then dying', async () => dying.errors.length > 0 && (await recordedTypes()).length >= expected.length, 10_000, 20).catch((e) => {
      throw new Error(`${(e as Error).message}; its errors: ${dying.errors.map(String).join(' | ')}`);
    });
    await dying.processor.stop();
    assert.equal(await recordedTypes(), expected, `recorded before it died (its errors: ${dying.errors.map(String).join(' | ')})`);

    const next = gatewayProcess(store, clock, { log: logApart(), db: store });
    await next.processor.start();
    await within(10_000, next.processor.caughtUp(), 'the next processor catching up');
    assert.is((await meterOf(store, keyId, D1)).holds.size, 0, 'both carried holds released');
    assert.is(await releasesOn(store, keyId, D1), 2, 'each released once');
    assert.equal(await recordedTypes(), expected, 'nothing recorded twice');
    await next.processor.stop();
    await gateway.metering.stop();
    assert.equal(next.errors, []);
  });

  it.run();
}
