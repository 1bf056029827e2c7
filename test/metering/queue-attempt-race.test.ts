/**
 * A waiting request's reservation attempt (the queue's wake, src/metering/queue.ts) takes a few turns:
 * the day's rollover, the key's re-check, the decision. Its waiter can stop waiting meanwhile: its queue
 * entry refused on fresh state (another process filled the queue first; a conflict decided it again)
 * or its client gone. The reservation the attempt then makes must still have an owner: the waiter it was
 * made for runs with it, or it is released. Before, it was stored and handed to a waiter already
 * refused, so nothing settled it, and the process renewed the hold for as long as it lived (the
 * two-gateway budget race: a request answered 429 queue_full with its BudgetReserved stored and never
 * settled). Real (in-memory) store; the attempt is held at the key's re-check and p's queue-entry
 * append at a gate, so the interleaving is the same every run.
 */
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import pino from 'pino';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { Metering, type AdmitRequest, type Admission } from '../../src/metering/index.ts';
import type { EventStore } from '../../src/store/index.ts';
import { meterDecider } from '../../deciders/meter.ts';
import { foldEvents } from '../../src/event-sourcing/index.ts';
import { meterEvents, meterStream, utcDay, type MeterEvent } from '../../events/meter.ts';
import { ApiError } from '../../src/errors/index.ts';
import { admitRequest } from '../support/admit-request.ts';
import { meteringSuite, type MeteringContext } from '../support/metering-suite.ts';
import { until } from '../support/until.ts';

const it = meteringSuite('metering: a waiter that stops waiting while its reservation is made');

const usage = { inputTokens: 5, outputTokens: 3, status: 200, latencyMs: 1, gpuSeconds: 0, costMicros: 0, pricePerGpuSecondMicros: 0, basis: 'engine_usage' as const, disconnected: false };
/** One active slot and one queue place: a second request waits, a third is refused queue_full. */
const limits = { maxActive: 1, maxQueued: 1 };

function meteringOn(context: { meterings: Metering[] }, store: EventStore, log: EventStore = store): Metering {
  const metering = new Metering({ handler: new CommandHandler({ store: log }), store, logger: pino({ level: 'silent' }), reservationTtlMs: 600_000, dailySpendCap: null });
  context.meterings.push(metering);
  return metering;
}

async function meterOf(store: EventStore, keyId: string): Promise<MeterEvent[]> {
  return (await store.readStream(meterStream(keyId, utcDay(new Date())))).events.map((e) => meterEvents.parse(e));
}

const openHolds = async (store: EventStore, keyId: string) => foldEvents(meterDecider, meterDecider.initialState(), await meterOf(store, keyId)).holds;

/** A request whose second look at its key (the queue's reservation attempt; the first is its own) waits until `open` is called. */
function heldAtSecondLook(request: AdmitRequest): { request: AdmitRequest; reached: () => boolean; open: () => void } {
  let looks = 0;
  let open!: () => void;
  const gate = new Promise<void>((resolve) => (open = resolve));
  const key = request.key;
  return {
    request: {
      ...request,
      key: async () => {
        if (++looks === 2) await gate;
        return key();
      },
    },
    reached: () => looks >= 2,
    open,
  };
}

/** Process p on a fresh key whose one active slot is taken by a request running there (`first`, `running`). */
async function slotTaken(context: MeteringContext): Promise<{ keyId: string; p: Metering; first: AdmitRequest; running: Admission }> {
  const keyId = randomUUID().slice(0, 12);
  const p = meteringOn(context, context.store);
  const first = admitRequest(keyId, { limits });
  const running = await p.admit(first);
  await running.durable;
  return { keyId, p, first, running };
}

it("a waiter whose queue entry another process's filled queue refuses while its reservation is made runs with that reservation; no hold is left", async (context) => {
  const { store } = context;
  const keyId = randomUUID().slice(0, 12);
  // p's appends of a queue entry wait at a gate: its entry is decided in memory and on its way meanwhile.
  let letQueueEntriesThrough!: () => void;
  const queueGate = new Promise<void>((resolve) => (letQueueEntriesThrough = resolve));
  const gated: EventStore = {
    ...store,
    async append(streamId, events, expected) {
      if (events.some((e) => e.type === 'RequestQueued')) await queueGate;
      return store.append(streamId, events, expected);
    },
  };
  const p = meteringOn(context, store, gated);
  // q does not follow the log: it learns of p's writes only from a conflict.
  const q = meteringOn(context, store);

  const first = admitRequest(keyId, { limits });
  const running = await p.admit(first);
  await running.durable;
  // q's request waits: its entry takes the key's only queue place.
  const qWaiting = q.admit(admitRequest(keyId, { limits })).catch((error: unknown) => error);
  await until("q's queue entry stored", async () => (await meterOf(store, keyId)).some((e) => e.type === 'RequestQueued'));

  // p's request W queues on what p last saw (an empty queue); its entry waits at the gate.
  const w = heldAtSecondLook(admitRequest(keyId, { limits }));
  const admitted = p.admit(w.request).then(
    (admission) => ({ admission }),
    (error: unknown) => ({ error }),
  );
  await until('W waits in p', async () => p.counts().queued === 1);
  // The running request settles: W's reservation attempt starts (p's settlement wakes it) and stops at the key's re-check.
  const settling = p.settle(running, first.facts, usage);
  await until("W's reservation attempt under way", async () => w.reached());
  // W's entry reaches the store after q's: decided again on fresh state it is refused queue_full; the settlement queued behind it is stored.
  letQueueEntriesThrough();
  await settling;
  assert.is((await meterOf(store, keyId)).filter((e) => e.type === 'RequestQueued').length, 1, "only q's entry stored");
  // The attempt goes on and reserves the slot the settlement freed.
  w.open();
  const outcome = (await admitted) as { admission?: Admission; error?: unknown };
  assert.ok(outcome.admission, `W was refused though its reservation was made: ${String(outcome.error)}`);
  const reservation = await outcome.admission.durable;
  assert.is(reservation.requestId, w.request.facts.request_id);
  await p.settle(reservation, w.request.facts, usage);
  assert.is((await openHolds(store, keyId)).size, 0, 'no hold left open');
  await q.stop();
  assert.instance(await qWaiting, Error, "q's request is refused when q stops");
});

it('a waiter whose client leaves while its reservation is made: the reservation is released at zero usage, not left open', async (context) => {
  const { store } = context;
  const { keyId, p, first, running } = await slotTaken(context);

  const client = new AbortController();
  const w = heldAtSecondLook({ ...admitRequest(keyId, { limits }), signal: client.signal });
  const admitted = p.admit(w.request).then(
    (admission) => ({ admission }),
    (error: unknown) => ({ error }),
  );
  await until('W waits in p', async () => p.counts().queued === 1);
  await p.settle(running, first.facts, usage);
  await until("W's reservation attempt under way", async () => w.reached());
  client.abort();
  const outcome = (await admitted) as { admission?: Admission; error?: unknown };
  assert.ok(outcome.error, 'the client left: W is not admitted');
  w.open();
  // Its reservation is made all the same; nobody will run or settle it, so it is released at once.
  await until('a reservation for W stored', async () => (await meterOf(store, keyId)).some((e) => e.type === 'BudgetReserved' && e.data.request_id === w.request.facts.request_id));
  const events = await until('no hold left open', async () => ((await openHolds(store, keyId)).size === 0 ? await meterOf(store, keyId) : null), 5_000);
  const settled = events.find((e) => e.type === 'UsageSettled' && e.data.request_id === w.request.facts.request_id);
  assert.ok(settled, 'W released by a settlement');
  assert.is(settled.type === 'UsageSettled' && settled.data.input_tokens + settled.data.output_tokens, 0, 'charged nothing');
  assert.is(p.counts().running, 0, 'nothing left to renew');
});

it('a request that would wait once the queue is closed (the process stopping) is refused at once, not left waiting for a slot', async (context) => {
  const { keyId, p, first, running } = await slotTaken(context);
  await p.stop();
  // A reservation sent back to the queue by a conflict during stop() comes this way too.
  const outcome = await Promise.race([
    p.admit(admitRequest(keyId, { limits })).then(() => 'admitted', (error: unknown) => error),
    new Promise((resolve) => setTimeout(resolve, 5_000, 'still waiting').unref()),
  ]);
  assert.instance(outcome, ApiError, String(outcome));
  assert.is((outcome as ApiError).code, 'wrapper_saturated');
  await p.settle(running, first.facts, usage);
});

it.run();
