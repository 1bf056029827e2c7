/**
 * Slot leases: a process whose reservation fits in its standing lease may start the engine call before
 * the append is durable, and the key's active cap still holds across processes, because a lease's
 * slots are taken for every other process. Two `Metering`s with their own command handlers (two
 * processes' caches) on one real store. Where the test is about staleness they do not follow the log,
 * so each decides on what it last saw and learns of the other's writes only from a conflict, the
 * worst case; where it is about waking a waiting request they follow it, as the gateway does.
 */
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import pino from 'pino';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { ApiError } from '../../src/errors/index.ts';
import { Metering, type Admission } from '../../src/metering/index.ts';
import { Voiding } from '../../src/metering/types.ts';
import type { EventStore } from '../../src/store/index.ts';
import { meterEvents, meterStream, utcDay, type MeterEvent } from '../../events/meter.ts';
import type { KeyBudgetValues } from '../../events/key.ts';
import { admitRequest } from '../support/admit-request.ts';
import { meteringSuite } from '../support/metering-suite.ts';

const it = meteringSuite('metering: slot leases across processes');

const process_ = async (context: { store: EventStore; meterings: Metering[] }, followLog = false): Promise<Metering> => {
  const handler = new CommandHandler({ store: context.store });
  const metering = new Metering({ handler, store: context.store, logger: pino({ level: 'silent' }), reservationTtlMs: 600_000, dailySpendCap: null });
  if (followLog) {
    const following = await handler.followLog();
    metering.start();
    context.meterings.push({ stop: () => following.stop() } as Metering);
  }
  context.meterings.push(metering);
  return metering;
};
/** Fails the test instead of letting it hang (and keeps the event loop alive meanwhile). */
async function within<T>(ms: number, work: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([work, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`not within ${ms} ms`)), ms)))]);
  } finally {
    clearTimeout(timer);
  }
}
const usage = { inputTokens: 5, outputTokens: 3, status: 200, latencyMs: 1, gpuSeconds: 0, costMicros: 0, pricePerGpuSecondMicros: 0, basis: 'engine_usage' as const, disconnected: false };

async function meterOf(store: EventStore, keyId: string): Promise<MeterEvent[]> {
  return (await store.readStream(meterStream(keyId, utcDay(new Date())))).events.map((e) => meterEvents.parse(e));
}

it("a key's first request in a process waits for its append; the next, in the lease it took, starts at once", async (context) => {
  const p = await process_(context);
  const keyId = randomUUID().slice(0, 12);
  const first = admitRequest(keyId);
  const a = await p.admit(first);
  assert.is(a.startNow, false, 'taking the lease: the engine waits for the append');
  await a.durable;
  await p.settle(a, first.facts, usage);
  const second = admitRequest(keyId);
  const b = await p.admit(second);
  assert.is(b.startNow, true, 'in the standing lease');
  // Two at once: the second grows the lease, so it waits.
  const c = await p.admit(admitRequest(keyId));
  assert.is(c.startNow, false, 'growing the lease: the engine waits for the append');
  await Promise.all([b.durable, c.durable]);
  assert.equal((await meterOf(context.store, keyId)).map((e) => e.type), ['MeterOpened', 'SlotsLeased', 'BudgetReserved', 'UsageSettled', 'BudgetReserved', 'SlotsLeased', 'BudgetReserved']);
});

it('slots leased by one process are taken for the other: 16 across both, never more, and freed as the lease shrinks', async (context) => {
  const [p, q] = [await process_(context, true), await process_(context, true)];
  const keyId = randomUUID().slice(0, 12);
  const running: { m: Metering; req: ReturnType<typeof admitRequest>; admission: Admission }[] = [];
  for (let i = 0; i < 10; i++) {
    const req = admitRequest(keyId);
    const admission = await p.admit(req);
    await admission.durable;
    running.push({ m: p, req, admission });
  }
  for (let i = 0; i < 6; i++) {
    const req = admitRequest(keyId);
    const admission = await q.admit(req);
    await admission.durable;
    running.push({ m: q, req, admission });
  }
  // The 17th, from either process, waits in that process's queue.
  const waitingQ = admitRequest(keyId);
  let admittedQ: Admission | null = null;
  const queued = q.admit(waitingQ).then((a) => (admittedQ = a));
  await new Promise((r) => setTimeout(r, 400));
  assert.is(admittedQ, null, 'q had no slot: all 16 are leased or held');

  // p settles one: its lease shrinks to the 9 it still runs, and q's waiting request takes the slot.
  const done = running.shift()!;
  await p.settle(done.admission, done.req.facts, usage);
  const admitted = await within(5_000, queued);
  await admitted.durable;
  const events = await meterOf(context.store, keyId);
  const leases = new Map<string, number>();
  for (const e of events) if (e.type === 'SlotsLeased') leases.set(e.data.holder, e.data.slots);
  assert.equal([...leases.values()].sort((x, y) => x - y), [7, 9], 'p shrank to 9, q grew to 7');
  const open = new Set<string>();
  for (const e of events) {
    if (e.type === 'BudgetReserved') open.add(e.data.request_id);
    if (e.type === 'UsageSettled') open.delete(e.data.request_id);
  }
  assert.is(open.size, 16);
});

it("a request waiting in a process takes the slot that process's settlement freed at once, before the settlement is stored", async (context) => {
  const p = await process_(context);
  const keyId = randomUUID().slice(0, 12);
  const running: { req: ReturnType<typeof admitRequest>; admission: Admission }[] = [];
  for (let i = 0; i < 16; i++) {
    const req = admitRequest(keyId);
    const admission = await p.admit(req);
    await admission.durable;
    running.push({ req, admission });
  }
  const waiting = p.admit(admitRequest(keyId));
  await new Promise((r) => setTimeout(r, 50));
  let stored = false;
  const done = running[0];
  const settling = p.settle(done.admission, done.req.facts, usage).then(() => (stored = true));
  const admitted = await within(5_000, waiting);
  assert.is(stored, false, 'admitted while the settlement was still on its way to the store');
  assert.is(admitted.startNow, true, 'in the lease the settlement left standing');
  await Promise.all([settling, admitted.durable]);
});

/**
 * p takes its lease with a first request of 5 + 16 tokens (budget 100), settled at 5 + 3; q, which p
 * has not heard of, then reserves 5 + `qMaxTokens`; p decides its next request on what it last saw
 * (92 left): in its lease, so its engine call may start at once.
 */
async function leasedOnStaleState(context: { store: EventStore; meterings: Metering[] }, qMaxTokens: number): Promise<Admission> {
  const [p, q] = [await process_(context), await process_(context)];
  const keyId = randomUUID().slice(0, 12);
  const budgets: Partial<KeyBudgetValues> = { monthly_token_budget: 100 };
  const first = admitRequest(keyId, { budgets });
  const a = await p.admit(first);
  await a.durable;
  await p.settle(a, first.facts, usage);
  await (await q.admit(admitRequest(keyId, { budgets, maxTokens: qMaxTokens }))).durable;
  const late = await p.admit(admitRequest(keyId, { budgets }));
  assert.is(late.startNow, true);
  assert.is(late.maxTokens, 16);
  return late;
}

it('a reservation started at once is voided when the other process spent the budget first, and refused', async (context) => {
  // 8 + 89 of 100 gone: p's append conflicts, it decides again on fresh state, and the 3 tokens left do not cover its 5 of prompt.
  const late = await leasedOnStaleState(context, 84);
  try {
    await late.durable;
    assert.unreachable('the reservation was stored');
  } catch (error) {
    assert.instance(error, ApiError);
    assert.is((error as ApiError).code, 'budget_exceeded');
  }
  assert.ok(late.voiding.voided, 'the engine call started on it is cancelled');
});

it('decided again with fewer tokens, an early reservation is voided and the stored one carries the new max_tokens', async (context) => {
  const late = await leasedOnStaleState(context, 70); // 8 + 75 gone: 17 left
  const stored = await late.durable;
  assert.ok(late.voiding.voided);
  assert.is(stored.maxTokens, 12, '17 left less 5 of prompt');
  assert.is(stored.clampedBy, 'monthly_token_budget');
});

it('a voiding tells each listener once, and one added after it at once', () => {
  const voiding = new Voiding();
  const heard: string[] = [];
  voiding.onVoided(() => heard.push('engine call'));
  voiding.onVoided(() => heard.push('early response'));
  assert.is(voiding.voided, false);
  voiding.void();
  voiding.void();
  assert.ok(voiding.voided);
  voiding.onVoided(() => heard.push('late'));
  assert.equal(heard, ['engine call', 'early response', 'late']);
});

it.run();
