/**
 * What metering does on the passing of time. Its own work, on a loop of its own: it renews the holds
 * of requests still running in this process and its slot leases on their keys (their liveness is this
 * process's to tell, and only this process can tell it). And two periodic workflows
 * (workflows/timed-workflows.ts), driven by the workflow processor in the one process holding each
 * one's lease: the reaper (holds past their expiry or whose slot lease lapsed, from the meter_holds
 * projection, expired on their own day's stream) and the spend watcher (the day's spend, from the
 * daily_spend projection, reported to the spend decider, whose rule reaches the cap). This module
 * gives them their views and sends their commands (`timers`). Their commands carry ids derived from
 * what they act on, so a tick that died half-way is simply decided again.
 */
import type { Logger } from 'pino';
import type { CommandHandler } from '../command-handler/index.ts';
import type { Queryable } from '../store/index.ts';
import type { WorkflowCommand } from '../event-sourcing/index.ts';
import type { ServiceWorkflows } from '../processors/index.ts';
import { meterDecider, spendDecider, type MeterCommand, type SpendCommand } from '../../deciders/index.ts';
import { holdReaperWorkflow, spendWatcherWorkflow, watchSpend } from '../../workflows/index.ts';
import { toMicros } from '../../deciders/billing.ts';
import { expiredHolds, spendOfDay } from '../../projections/index.ts';
import { meterStreamParts, utcDay } from '../../events/index.ts';
import type { Reservation } from './types.ts';

export interface SweeperOptions {
  handler: CommandHandler;
  /** The SQL database the projections' tables are read from (meter_holds, daily_spend). */
  db: Queryable;
  logger: Logger;
  ttlMs: number;
  /** This process's name on its slot leases, their TTL, and how often the renewals and the timers run (the lease is renewed in time for the next). */
  holder: string;
  leaseTtlMs: number;
  sweepMs: number;
  spendCap: number | null;
  /** Holds of requests running in this process, with when each expires as last renewed. */
  running: Map<string, Reservation & { expiresAt: number }>;
  now: () => Date;
  /** A key's hold was expired: its waiting requests may find a slot. */
  freed(keyId: string): void;
}

export class Sweeper {
  readonly #o: SweeperOptions;
  /** The UTC day whose spend cap is known reached (this process's check, or another's SpendCapReached). */
  spendCappedDay: string | null = null;
  /** The spend check under way (checkSpendSoon), and whether calls came in meanwhile. */
  #checking: Promise<void> | null = null;
  #checkAgain = false;

  constructor(options: SweeperOptions) {
    this.#o = options;
  }

  /** The renewals of what this process runs: its holds, then its slot leases. */
  async renew(): Promise<void> {
    const now = this.#o.now();
    await this.#renew(now);
    await this.#renewLeases(now);
  }

  /** The reaper and (with a cap) the spend watcher, as the workflow processor drives them: their views read here, their commands sent here. */
  timers(): ServiceWorkflows {
    const { db, leaseTtlMs, sweepMs, running, spendCap } = this.#o;
    const reaper = holdReaperWorkflow({
      periodMs: sweepMs,
      leaseTtlMs,
      read: async (tick) => {
        const now = new Date(tick.now);
        return { expired: await expiredHolds(db, now, 500, new Date(now.getTime() - leaseTtlMs)), runningHere: new Set(running.keys()) };
      },
    });
    const watcher = spendWatcherWorkflow({ periodMs: sweepMs, read: (tick) => this.#spendView(new Date(tick.now)) });
    return {
      workflows: spendCap === null ? [reaper] : [reaper, watcher],
      deliver: { [reaper.name]: (output) => this.#expire(output), [watcher.name]: (output) => this.#report(output) },
    };
  }

  /**
   * A spend check that covers every priced settlement so far: one runs at a time, and the calls made
   * while it runs share one more after it. The spend is read from a projection (daily_spend), which
   * moves a batch at a time, so a read per settlement (one query per request at full load) would learn
   * nothing a read per round trip does not. Never rejects: a failed check is logged, and the next
   * settlement or tick checks again.
   */
  checkSpendSoon(): Promise<void> {
    if (this.#checking) {
      this.#checkAgain = true;
      return this.#checking;
    }
    const run = async () => {
      do {
        this.#checkAgain = false;
        await this.#checkSpend().catch((error) => this.#o.logger.error({ err: String(error) }, 'spend check failed'));
      } while (this.#checkAgain);
      this.#checking = null;
    };
    return (this.#checking = run());
  }

  /** The holds of requests running here, in the second half of their time, renewed for a whole TTL. */
  async #renew(now: Date): Promise<void> {
    const { handler, ttlMs, running, logger } = this.#o;
    for (const hold of running.values()) {
      if (hold.expiresAt - now.getTime() > ttlMs / 2) continue;
      const expiresAt = now.getTime() + ttlMs;
      try {
        await handler.handle(hold.stream, { type: 'Renew', requestId: hold.requestId, expiresAt: new Date(expiresAt).toISOString(), now: now.toISOString() }, meterDecider);
        hold.expiresAt = expiresAt;
      } catch (error) {
        logger.error({ err: String(error), request_id: hold.requestId }, 'renewing a hold failed');
      }
    }
  }

  /**
   * The slot lease of each key this process still runs requests of, kept standing while they run (the
   * meter decider renews it once less than half would be left at the next renewal): a lease that lapses
   * lets the reaper expire the holds made under it, which is how the holds of a process that died are
   * freed within a lease rather than a reservation TTL.
   */
  async #renewLeases(now: Date): Promise<void> {
    const { handler, running, logger, holder, leaseTtlMs, sweepMs } = this.#o;
    const streams = new Set<string>();
    for (const hold of running.values()) streams.add(hold.stream);
    for (const stream of streams) {
      try {
        await handler.handle(stream, { type: 'RenewLease', holder, ttlMs: leaseTtlMs, nextCheckMs: sweepMs, now: now.toISOString() }, meterDecider);
      } catch (error) {
        logger.error({ err: String(error), stream }, 'renewing a slot lease failed');
      }
    }
  }

  /** The reaper's command: expired on the hold's stream; a key whose hold it ended may take a waiting request. */
  async #expire({ stream, command, commandId }: WorkflowCommand<MeterCommand>): Promise<void> {
    const outcome = await this.#o.handler.handle(stream, command, meterDecider, { commandId, metadata: { workflow: 'hold-reaper' } });
    if (!outcome.accepted || outcome.newEvents.length === 0) return;
    const keyId = meterStreamParts(stream)!.keyId;
    this.#o.logger.warn({ request_id: (command as { requestId?: string }).requestId, key_id: keyId }, 'reservation expired: its request died with its process (its slot lease lapsed, or its TTL passed)');
    this.#o.freed(keyId);
  }

  /** The spend watcher's command: the day's spend reported; once the cap is reached, this process pauses (others learn it from the log). */
  async #report({ stream, command, commandId }: WorkflowCommand<SpendCommand>): Promise<void> {
    const outcome = await this.#o.handler.handle(stream, command, spendDecider, { commandId });
    if (!outcome.accepted || !outcome.state.reached) return;
    this.spendCappedDay = command.day;
    if (outcome.newEvents.length > 0) this.#o.logger.warn({ day: command.day, spend_micros: command.spendMicros, cap_micros: command.capMicros }, 'daily GPU spend cap reached: the service answers 429 spend_cap until the next UTC day');
  }

  /** The spend watcher's view at `now`: the cap in integer micro-units (met exactly, like daily_spend's cost_micros), and the day's spend unless the cap is known reached. */
  async #spendView(now: Date): Promise<{ spendMicros: number; capMicros: number | null; reachedDay: string | null }> {
    const { spendCap, db } = this.#o;
    const view = { capMicros: spendCap === null ? null : toMicros(spendCap), reachedDay: this.spendCappedDay, spendMicros: 0 };
    if (view.capMicros !== null && view.reachedDay !== utcDay(now)) view.spendMicros = (await spendOfDay(db, utcDay(now))).costMicros;
    return view;
  }

  /** Reports the day's spend after a settlement that cost something (the same rule as the watcher's tick). */
  async #checkSpend(): Promise<void> {
    const now = this.#o.now();
    for (const output of watchSpend({ now: now.toISOString() }, await this.#spendView(now))) await this.#report(output);
  }
}
