/**
 * Holds are tied to their process's slot lease: a process that dies holding requests stops renewing
 * its lease, and once it lapses any process's reaper expires those holds (charged whole, as every
 * expiry), long before their reservation TTL; a living process's renewals keep its lease standing while
 * its requests run, so its holds are left alone however long they run. Two processes' `Metering`s
 * (their own command handlers) on one real store, the projection the reaper reads (meter_holds), a
 * clock the test moves; PGlite, and PostgreSQL when DATABASE_URL is set.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import pino from 'pino';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { Metering } from '../../src/metering/index.ts';
import { ProjectionRunner, WorkflowProcessor } from '../../src/processors/index.ts';
import { meterHoldsProjection } from '../../projections/index.ts';
import { meterEvents, meterStream, type MeterEvent } from '../../events/meter.ts';
import type { EventStore } from '../../src/store/index.ts';
import { adaptersUnderTest } from '../store/adapters.ts';
import { admitRequest } from '../support/admit-request.ts';
import { until } from '../support/until.ts';
import { within } from '../support/within.ts';

const ttlMs = 600_000;
const leaseMs = 10_000;
const D = '2026-11-24';
const T0 = Date.parse(`${D}T12:00:00Z`);
const usage = { inputTokens: 5, outputTokens: 3, status: 200, latencyMs: 1, gpuSeconds: 0, costMicros: 0, pricePerGpuSecondMicros: 0, basis: 'engine_usage' as const, disconnected: false };

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore }>(`metering: a dead process's holds end with its slot lease (${adapter.name})`);
  it.before(async (context) => {
    context.store = await adapter.open({ pollIntervalMs: 100 });
  });
  it.after(async (context) => {
    await context.store?.close();
    await adapter.cleanup();
  });

  it("a dead process's holds are expired once its lease lapses; a living process's long request is kept, its lease renewed by its sweep", async ({ store }) => {
    const keyId = randomUUID().slice(0, 12);
    const clock = { now: new Date(T0) };
    const meter = (handler: CommandHandler) =>
      new Metering({ handler, store, logger: pino({ level: 'silent' }), reservationTtlMs: ttlMs, slotLeaseTtlMs: leaseMs, dailySpendCap: null, sweepIntervalMs: 50, now: () => clock.now });
    const events = async (): Promise<MeterEvent[]> => (await store.readStream(meterStream(keyId, D))).events.map((e) => meterEvents.parse(e));
    const runner = new ProjectionRunner({ store, projections: [meterHoldsProjection], pollIntervalMs: 100 });
    await runner.start();
    const livingHandler = new CommandHandler({ store });
    const following = await livingHandler.followLog();
    const dead = meter(new CommandHandler({ store }));
    const living = meter(livingHandler);
    // The living process's reaper: its metering's timers, driven by a workflow processor on the test's clock.
    const reaper = new WorkflowProcessor({ store, handler: livingHandler, ...living.timers(), now: () => clock.now, idleCheckpointMs: 50, pollIntervalMs: 100 });
    try {
      // The dead process's two requests, never settled (it was killed); the living one's, still running.
      const deadHolds = [await dead.admit(admitRequest(keyId)), await dead.admit(admitRequest(keyId))];
      for (const h of deadHolds) await h.durable;
      const runningRequest = admitRequest(keyId);
      const running = await living.admit(runningRequest);
      await running.durable;
      await within(10_000, runner.caughtUp(), 'meter_holds catching up');
      living.start();
      await reaper.start();

      // Past half the living lease: its sweep renews it (the dead one's is not).
      clock.now = new Date(T0 + leaseMs / 2 + 1);
      await until('the living lease renewed', async () => (await events()).some((e) => e.type === 'SlotLeaseRenewed'), 10_000, 20);
      assert.is((await events()).filter((e) => e.type === 'ReservationExpired').length, 0, 'both leases stand: nothing expired');

      // The dead lease has lapsed, its holds' TTL is 9 minutes away: the living process's reaper expires them.
      clock.now = new Date(T0 + leaseMs + 1_000);
      await within(10_000, runner.caughtUp(), 'meter_holds catching up');
      const expired = await until(
        "the dead process's holds expired",
        async () => {
          const ids = (await events()).filter((e) => e.type === 'ReservationExpired').map((e) => (e.data as { request_id: string }).request_id);
          return ids.length === 2 ? ids : null;
        },
        10_000,
        20,
      );
      assert.equal(expired.sort(), deadHolds.map((h) => h.requestId).sort(), 'each dead hold expired once');
      const all = await events();
      const tokens = (e: MeterEvent) => [(e.data as { input_tokens: number }).input_tokens, (e.data as { output_tokens: number }).output_tokens];
      for (const e of all.filter((x) => x.type === 'ReservationExpired')) {
        const reserved = all.find((x) => x.type === 'BudgetReserved' && x.data.request_id === (e.data as { request_id: string }).request_id)!;
        assert.equal(tokens(e), tokens(reserved), 'charged whole, as every expiry');
      }

      // The clock moves on by 2 s at a time, for three leases: the living lease is kept standing by
      // the sweep (at least half of it left at each step), and its hold is never expired.
      const deadHolder = (all.find((e) => e.type === 'BudgetReserved' && e.data.request_id === deadHolds[0].requestId)!.data as { lease_holder: string }).lease_holder;
      const livingLeaseEnd = async () => {
        let end = 0;
        for (const e of await events()) if ((e.type === 'SlotsLeased' || e.type === 'SlotLeaseRenewed') && e.data.holder !== deadHolder) end = Date.parse(e.data.expires_at);
        return end;
      };
      for (let at = T0 + leaseMs + 3_000; at <= T0 + 4 * leaseMs; at += 2_000) {
        clock.now = new Date(at);
        await until('the living lease keeping half its time', async () => (await livingLeaseEnd()) - at >= leaseMs / 2 - 100, 10_000, 20);
      }
      await within(10_000, runner.caughtUp(), 'meter_holds catching up');
      await new Promise((r) => setTimeout(r, 300)); // more sweeps: the living hold is not expired
      await living.settle(running, runningRequest.facts, usage);
      await until('the living request settled', async () => (await events()).some((e) => e.type === 'UsageSettled'), 10_000, 20);
      const closes = (await events()).filter((e) => e.type === 'UsageSettled' || e.type === 'ReservationExpired');
      assert.equal(
        closes.map((e) => [e.type, (e.data as { request_id: string }).request_id]).filter(([, id]) => id === running.requestId),
        [['UsageSettled', running.requestId]],
        'the living hold settled, never expired',
      );
    } finally {
      await reaper.stop();
      await living.stop();
      await dead.stop();
      await following.stop();
      await runner.stop();
    }
  });

  it.run();
}
