/**
 * A refusal the client gets rests on what the store holds. A process decides each reservation on its
 * latest state, its own reservations still on their way to the store included; one of those can lose
 * its race to another process and be decided again without the start (or the tokens) a refusal decided
 * on top of it counted (the three-gateway limits test once saw a 429 rate_limited with 29 stored starts
 * of 30). So such a refusal is answered only once they are stored, and if one lost its race, as decided
 * again with them (the command handler's rule; test/command-handler has the race itself). Real
 * (in-memory) store; the append the refusal counted is held at a gate, so the interleaving is the same
 * every run.
 */
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import pino from 'pino';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { Metering } from '../../src/metering/index.ts';
import type { EventStore } from '../../src/store/index.ts';
import { meterDecider } from '../../deciders/meter.ts';
import { foldEvents } from '../../src/event-sourcing/index.ts';
import { meterEvents, meterStream, utcDay } from '../../events/meter.ts';
import { admitRequest } from '../support/admit-request.ts';
import { meteringSuite } from '../support/metering-suite.ts';
import { ApiError } from '../../src/errors/index.ts';

const it = meteringSuite('metering: a refusal decided on reservations not yet stored');

const usage = { inputTokens: 5, outputTokens: 3, status: 200, latencyMs: 1, gpuSeconds: 0, costMicros: 0, pricePerGpuSecondMicros: 0, basis: 'engine_usage' as const, disconnected: false };
/** Two request starts a minute. */
const options = { limits: { perMinute: 2 } };

const meterOf = async (store: EventStore, keyId: string) => (await store.readStream(meterStream(keyId, utcDay(new Date())))).events.map((e) => meterEvents.parse(e));

it('a refusal counting a reservation still on its way to the store is answered once that is stored', async (context) => {
  const { store } = context;
  const keyId = randomUUID().slice(0, 12);
  let gated = false;
  let reachedGate!: () => void;
  const atGate = new Promise<void>((resolve) => (reachedGate = resolve));
  let openGate!: () => void;
  const gate = new Promise<void>((resolve) => (openGate = resolve));
  const gatedStore: EventStore = {
    ...store,
    async append(streamId, events, expected) {
      if (gated && events.some((e) => e.type === 'BudgetReserved')) {
        gated = false;
        reachedGate();
        await gate;
      }
      return store.append(streamId, events, expected);
    },
  };
  const p = new Metering({ handler: new CommandHandler({ store: gatedStore }), store, logger: pino({ level: 'silent' }), reservationTtlMs: 600_000, dailySpendCap: null });
  context.meterings.push(p);

  const first = admitRequest(keyId, options);
  await p.settle(await (await p.admit(first)).durable, first.facts, usage);
  // The minute's second start, decided and on its way (held at the gate)...
  gated = true;
  const second = admitRequest(keyId, options);
  const secondAdmission = await p.admit(second);
  await atGate;
  // ...and a third decided on top of it: rate_limited, on a start not stored yet.
  let answered = false;
  const third = p.admit(admitRequest(keyId, options)).then(
    () => assert.unreachable('a third start in the minute'),
    (error: unknown) => {
      answered = true;
      return error;
    },
  );
  await new Promise((resolve) => setTimeout(resolve, 50));
  const answeredEarly = answered;
  openGate();
  assert.not.ok(answeredEarly, 'not answered while the start it counted is on its way');
  const refusal = await third;
  assert.instance(refusal, ApiError);
  assert.is((refusal as ApiError).code, 'rate_limited');
  const secondRunning = await secondAdmission.durable;
  await p.settle(secondRunning, second.facts, usage);
  const meter = await meterOf(store, keyId);
  assert.is(meter.filter((e) => e.type === 'BudgetReserved').length, 2, 'two starts stored, as the refusal counted');
  assert.is(foldEvents(meterDecider, meterDecider.initialState(), meter).holds.size, 0, 'no hold left open');
});

it.run();
