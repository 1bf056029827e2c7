/**
 * Metering, the admission service over the meter decider (deciders/meter.ts): reserve before the
 * engine runs, settle with its real usage. It loads, decides (in memory, through the command handler;
 * concurrent reservations on one key leave in one append), and maps a rejection to the contract's
 * error. A reservation that fits in this process's standing slot lease lets the engine start at once,
 * alongside its append; one that takes or grows the lease waits for the append first (SlotsLeased in
 * events/meter.ts). Beside it, each a module of its own:
 * - queue.ts: the per-key FIFO of requests waiting for an active slot (its bound is the decider's, across processes);
 * - rollover.ts: a key's first reservation of a UTC day opens the day's meter from the previous day's balance;
 * - retry.ts: a settlement survives a passing store failure;
 * - rejections.ts: the decider's rejections as the contract's errors.
 * Reactions across streams are workflows, not steps here: a hold carried over midnight is released by
 * workflows/carried-holds.ts (driven by src/processors); the reaper and the spend watcher are the
 * periodic workflows of workflows/timed-workflows.ts (`timers()`, for the workflow processor). This
 * service's own loop renews the holds of requests still running in this process and their slot leases.
 */
import { randomUUID } from 'node:crypto';
import { setImmediate as nextTurn } from 'node:timers/promises';
import type { Logger } from 'pino';
import { apiError } from '../errors/index.ts';
import type { CommandHandler } from '../command-handler/index.ts';
import type { EventLog, EventStore, Queryable } from '../store/index.ts';
import type { ServiceWorkflows } from '../processors/index.ts';
import { meterDayAfterRefusal, meterDecider, secondsUntilUtcTurn, spendCapPauses } from '../../deciders/index.ts';
import { meterStream, meterStreamParts, utcDay, type RequestFactsData } from '../../events/index.ts';
import { RequestQueue } from './queue.ts';
import { Sweeper } from './sweeper.ts';
import { DayRollover } from './rollover.ts';
import { persist } from './retry.ts';
import { rejectionToApiError } from './rejections.ts';

export { refusalOf, rejectionToApiError } from './rejections.ts';

import { noRefusal, Voiding, type AdmitRequest, type Admission, type Refusal, type Reservation, type Usage } from './types.ts';

export type { AdmitRequest, Admission, MeteredKey, Refusal, Reservation, Usage, Voiding } from './types.ts';

/** The usage of a request answered before it reached the engine (its reservation was not confirmed). */
const notRun: Usage = { inputTokens: 0, outputTokens: 0, status: 503, latencyMs: 0, gpuSeconds: 0, costMicros: 0, pricePerGpuSecondMicros: null, basis: 'not_run', disconnected: false };

/**
 * What metering reads besides its decisions: the day rollover asks the log which meter days exist,
 * the sweep reads the SQL tables (meter_holds, daily_spend). One SQL store is both.
 */
export type MeteringSources = { store: EventStore } | { log: Pick<EventLog, 'streamVersions'>; db: Queryable };

export type MeteringOptions = MeteringSources & MeteringSettings;

export interface MeteringSettings {
  handler: CommandHandler;
  logger: Logger;
  /** A hold whose request died is expired this long after it was made or last renewed. */
  reservationTtlMs: number;
  /** Past this day's GPU spend the whole service answers 429 spend_cap until the next UTC day; null: no cap. */
  dailySpendCap: number | null;
  /** How often the renewals run, and the reaper's and the spend watcher's ticks (default: a quarter of the TTL or of the slot lease, whichever is shorter, at most 15 s). */
  sweepIntervalMs?: number;
  /**
   * How long a settlement's (or a refused request's record's) append may wait for later decisions on
   * the key's meter to leave with it (default 5 ms): decided in memory at once, it is written off the
   * path of the client's next request rather than in front of it.
   */
  settleLingerMs?: number;
  /**
   * How long a slot lease stands without a renewal (default: 60 s, or the TTL when shorter): the
   * longest a process keeps an idle slot of a key from the other processes, and, if it died, the
   * longest its lease's slots and its holds stay taken (the reaper expires a hold whose lease lapsed).
   * This process renews it while requests under it run.
   */
  slotLeaseTtlMs?: number;
  now?: () => Date;
}

export class Metering {
  readonly #handler: CommandHandler;
  readonly #logger: Logger;
  readonly #ttlMs: number;
  readonly #sweepMs: number;
  readonly #leaseTtlMs: number;
  readonly #lingerMs: number;
  /** This process's name on its slot leases. */
  readonly #holder = randomUUID();
  readonly #now: () => Date;
  /** Requests waiting for one of the key's active slots, per key (the bound is the meter's, across processes). */
  readonly #queue: RequestQueue<AdmitRequest, Admission>;
  /** Holds of requests running in this process: renewed while they run. */
  readonly #running = new Map<string, Reservation & { expiresAt: number }>();
  readonly #rollover: DayRollover;
  readonly #background = new Set<Promise<unknown>>();
  readonly #sweeper: Sweeper;
  #timer: NodeJS.Timeout | null = null;
  /** Aborted by stop(): writes being tried again give up. */
  readonly #stopping = new AbortController();
  #unlisten: (() => void) | null = null;
  /** A deferred sendDecisions is queued. */
  #sendQueued = false;

  constructor(options: MeteringOptions) {
    this.#handler = options.handler;
    this.#logger = options.logger;
    this.#ttlMs = options.reservationTtlMs;
    this.#leaseTtlMs = options.slotLeaseTtlMs ?? Math.min(60_000, options.reservationTtlMs);
    // Often enough to renew the holds in time, and the slot leases of the requests running here.
    this.#sweepMs = options.sweepIntervalMs ?? Math.min(15_000, Math.max(50, Math.floor(Math.min(options.reservationTtlMs, this.#leaseTtlMs) / 4)));
    this.#lingerMs = options.settleLingerMs ?? 5;
    this.#now = options.now ?? (() => new Date());
    this.#rollover = new DayRollover(options.handler, 'store' in options ? options.store : options.log);
    this.#sweeper = new Sweeper({
      handler: options.handler,
      db: 'store' in options ? options.store : options.db,
      logger: options.logger,
      ttlMs: this.#ttlMs,
      holder: this.#holder,
      leaseTtlMs: this.#leaseTtlMs,
      sweepMs: this.#sweepMs,
      spendCap: options.dailySpendCap,
      running: this.#running,
      now: this.#now,
      freed: (keyId) => this.#wake(keyId),
    });
    this.#queue = new RequestQueue<AdmitRequest, Admission>({
      handler: this.#handler,
      logger: this.#logger,
      holder: this.#holder,
      entryTtlMs: this.#leaseTtlMs,
      tryReserve: (request) => this.#tryReserve(request),
      refusal: rejectionToApiError,
      // A reservation made for a request that stopped waiting meanwhile: released at zero usage once stored.
      release: (request, admission) => {
        admission.voiding.void();
        void this.#track(admission.durable.then((stored) => this.#settle(stored, request.facts, notRun), () => {}));
      },
      track: (work) => this.#track(work),
      now: this.#now,
    });
  }

  /**
   * Sends the reservations decided so far to the store, once the route's early engine call is on its
   * way. undici writes a request on an idle kept-alive connection from a setImmediate of its own (the
   * poll first sees whether the engine closed that socket), and on this VM a write to a process that
   * sleeps costs its writer up to 0.4 ms while that process wakes. So whichever answer takes longer
   * is asked first (the route's WriteOrder): `now`, the append is written at once, ahead of the engine
   * call (an engine that answers faster than a commit); else from a setImmediate queued after the
   * engine call's write, before the event loop polls again (where it would wait a turn, and against
   * an engine that answers at once, its answer). BENCHMARKS.md, gateway.
   */
  sendDecisions(now: boolean): void {
    if (now) {
      this.#handler.pendingAppends.sendNow();
      return;
    }
    // The decisions' own turn was queued before the engine call's write: it waits for this one.
    this.#handler.pendingAppends.holdForOneTurn();
    if (this.#sendQueued) return;
    this.#sendQueued = true;
    setImmediate(() => {
      this.#sendQueued = false;
      this.#handler.pendingAppends.sendNow();
    });
  }

  /** The reaper and the spend watcher, for the workflow processor (one process at a time runs them). */
  timers(): ServiceWorkflows {
    return this.#sweeper.timers();
  }

  /** Starts the renewals of what runs here, and wakes waiting requests on other processes' meter writes. */
  start(): void {
    this.#unlisten = this.#handler.onForeignEvent((event) => {
      if (event.type === 'SpendCapReached') this.#sweeper.spendCappedDay = (event.data as { day: string }).day;
      const meter = meterStreamParts(event.streamId);
      if (meter) this.#wake(meter.keyId);
    });
    const tick = () => {
      this.#track(this.#sweeper.renew()).finally(() => {
        if (this.#timer) this.#timer = setTimeout(tick, this.#sweepMs).unref();
      });
    };
    this.#timer = setTimeout(tick, this.#sweepMs).unref();
  }

  /** Stops the renewals and waits for settlements and records under way. */
  async stop(): Promise<void> {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    this.#stopping.abort();
    this.#unlisten?.();
    this.#queue.close(apiError('wrapper_saturated', 'the gateway is shutting down'));
    while (this.#background.size > 0) await Promise.allSettled([...this.#background]);
    await this.#handler.settled();
  }

  /**
   * Admits a request: reserves its worst case (prompt + max_tokens × choices, max_tokens lowered to fit
   * a budget when needed), or waits FIFO for an active slot, or throws the contract's error.
   */
  async admit(request: AdmitRequest): Promise<Admission> {
    const now = this.#now();
    if (spendCapPauses(this.#sweeper.spendCappedDay, now)) {
      throw apiError('spend_cap', 'the service has reached its daily GPU spend cap; it resumes at the next UTC day', { retryAfter: secondsUntilUtcTurn(now.getTime(), 'day') });
    }
    if (this.#queue.waiting(request.keyId) === 0) {
      const admitted = await this.#tryReserve(request);
      if (admitted) return admitted;
    }
    return this.#enqueue(request);
  }

  /** This process's requests holding a reservation (running or settling) and waiting for a slot (for /metrics). */
  counts(): { running: number; queued: number; byKey: { keyId: string; running: number; queued: number }[] } {
    const byKey = new Map<string, { keyId: string; running: number; queued: number }>();
    const of = (keyId: string) => byKey.get(keyId) ?? byKey.set(keyId, { keyId, running: 0, queued: 0 }).get(keyId)!;
    for (const { keyId } of this.#running.values()) of(keyId).running++;
    for (const [keyId, waiting] of this.#queue.waitingByKey()) of(keyId).queued = waiting;
    return { running: this.#running.size, queued: this.#queue.waitingTotal(), byKey: [...byKey.values()] };
  }

  /** Settles a reservation with the engine's real usage and releases the hold (also a hold carried into today). */
  settle(reservation: Reservation, facts: RequestFactsData, usage: Usage): Promise<void> {
    // Decided from the next turn: the route settles as it answers, and its response's write goes first.
    return this.#track(nextTurn().then(() => this.#settle(reservation, facts, usage)));
  }

  /**
   * Records a request refused after authentication (metadata only), with the budget or limit that
   * refused it and the Retry-After it was given (`refusal`, see rejections.ts). Not awaited by the response.
   */
  recordRejection(keyId: string, facts: RequestFactsData, code: string, status: number, inputTokens: number, latencyMs: number, refusal: Refusal = noRefusal): void {
    const now = this.#now();
    const command = { type: 'RecordRejection' as const, facts, code, status, inputTokens, latencyMs, refusedBy: refusal.refusedBy, retryAfterSeconds: refusal.retryAfterSeconds, now: now.toISOString() };
    void this.#track(
      this.#handler
        .handle(meterStream(keyId, utcDay(now)), command, meterDecider, {
          commandId: `rejected:${facts.request_id}`,
          metadata: { request_id: facts.request_id },
          lingerMs: this.#lingerMs,
        })
        .catch((error) => this.#logger.error({ err: String(error), request_id: facts.request_id }, 'recording a rejected request failed')),
    );
  }

  // --- admission ------------------------------------------------------------------------------

  /**
   * One reservation attempt: an Admission, or null when the key's active slots are all taken. `onDay`
   * is today's unless the meter refused today's (closed by a process whose clock passed midnight
   * first): then the day the decider's rule sends it to.
   */
  async #tryReserve(request: AdmitRequest, onDay?: string): Promise<Admission | null> {
    const now = this.#now();
    const day = onDay ?? utcDay(now);
    const keyId = request.keyId;
    const stream = meterStream(keyId, day);
    await this.#rollover.ensureOpened(keyId, day, now);
    const current = await request.key(); // the reservation re-check: the key as it is now
    const decision = await this.#handler.decide(
      stream,
      {
        type: 'Reserve',
        facts: request.facts,
        inputTokens: request.inputTokens,
        maxTokens: request.maxTokens,
        maxTokensRequested: request.maxTokensRequested,
        choices: request.choices,
        budgets: current.budgets,
        keyStatus: current.status,
        limits: { maxActive: request.limits.maxActive, perMinute: request.limits.perMinute, maxQueued: request.limits.maxQueued },
        ttlMs: this.#ttlMs,
        lease: { holder: this.#holder, ttlMs: this.#leaseTtlMs },
        now: now.toISOString(),
      },
      meterDecider,
      { commandId: `reserve:${request.facts.request_id}`, metadata: { request_id: request.facts.request_id } },
    );
    let outcome = decision.outcome;
    if (!outcome.accepted) {
      // A refusal rests on what the store holds: decided on top of this process's reservations still on
      // their way, it waits for them, since one that loses its race to another process is decided again
      // without the start (or the tokens, or the slot) the refusal counted, and the refusal with it, which
      // may then reserve after all. So its outcome is `durable`'s (at once when nothing was under way).
      outcome = await decision.durable.catch((error: unknown) => {
        throw this.#notStored(error, { requestId: request.facts.request_id, keyId, day, stream, maxTokens: 0, clampedBy: null }, request);
      });
    }
    if (!outcome.accepted) {
      if (outcome.rejection.rejected === 'at_capacity') return null;
      if (outcome.rejection.rejected === 'meter_closed') return this.#tryReserve(request, meterDayAfterRefusal(outcome.rejection, day)!);
      throw rejectionToApiError(outcome.rejection);
    }
    const reservation = reservationFrom(keyId, day, stream, outcome.newEvents);
    // In the lease as it stands (renewed alongside at most): no other process can take this slot, so the engine may start now.
    const startNow = outcome.newEvents.every((e) => e.type !== 'SlotsLeased') && outcome.newEvents.some((e) => e.type === 'BudgetReserved' && e.data.lease_holder !== null);
    const voiding = new Voiding();
    this.#running.set(reservation.requestId, { expiresAt: now.getTime() + this.#ttlMs, ...reservation });
    const durable = decision.durable.then(
      async (final): Promise<Reservation> => {
        if (final.accepted) {
          const stored = reservationFrom(keyId, day, stream, final.newEvents);
          if (stored.maxTokens !== reservation.maxTokens) voiding.void();
          this.#running.set(stored.requestId, { expiresAt: now.getTime() + this.#ttlMs, ...stored });
          return stored;
        }
        voiding.void();
        this.#running.delete(reservation.requestId);
        // Decided again on fresh state and refused: wait for a slot like any other request, or fail.
        if (final.rejection.rejected === 'at_capacity') return (await this.#enqueue(request)).durable;
        if (final.rejection.rejected === 'meter_closed') {
          const onNextDay = await this.#tryReserve(request, meterDayAfterRefusal(final.rejection, day)!);
          return (onNextDay ?? (await this.#enqueue(request))).durable;
        }
        throw rejectionToApiError(final.rejection);
      },
      (error: unknown) => {
        voiding.void();
        throw this.#notStored(error, reservation, request);
      },
    );
    return { startNow, voiding, durable, ...reservation };
  }

  /** A reservation whose decision could not be stored: the request is not run, and a hold it may have stored is released. */
  #notStored(error: unknown, reservation: Reservation, request: AdmitRequest): Error {
    this.#logger.error({ err: String(error), request_id: request.facts.request_id }, 'reservation could not be stored');
    // The append's outcome may be unknown (its connection broke after the commit): release the hold
    // it may have stored, at zero usage, instead of leaving it to the reaper (which charges it whole).
    // Settling a request the meter holds nothing for decides nothing.
    void this.#track(this.#settle(reservation, request.facts, notRun));
    return apiError('store_unavailable', 'the usage store is unavailable; the request was not run');
  }

  #enqueue(request: AdmitRequest): Promise<Admission> {
    return this.#queue.enqueue(request);
  }

  /** Lets the key's waiting requests try again (a slot may have freed). */
  #wake(keyId: string): void {
    this.#queue.wake(keyId);
  }

  // --- settling, expiring ---------------------------------------------------------------------

  async #settle(reservation: Reservation, facts: RequestFactsData, usage: Usage): Promise<void> {
    const now = this.#now();
    // The hold stays renewed while the settlement is tried again: the real usage is known here.
    const stored = await persist(async () => {
      const decision = await this.#handler.decide(
        reservation.stream,
        { type: 'Settle', facts, lease: { holder: this.#holder, waiting: this.#queue.waiting(reservation.keyId) }, now: now.toISOString(), ...usage },
        meterDecider,
        { commandId: `settle:${reservation.requestId}`, metadata: { request_id: reservation.requestId }, lingerMs: this.#lingerMs },
      );
      // Decided, the slot is free in memory: a request waiting here takes it now, not once the lingering
      // append is stored (its reservation's append takes this one along).
      this.#wake(reservation.keyId);
      // A hold carried into a later day is released there by the carried-holds workflow (workflows/carried-holds.ts).
      await decision.durable;
    }, {
      giveUpAfterMs: this.#ttlMs / 2,
      signal: this.#stopping.signal,
      onRetry: (error) => this.#logger.warn({ err: String(error), request_id: reservation.requestId }, 'settlement could not be stored yet; trying again'),
    });
    // Not stored: the hold stays until the reaper expires it; the budget stays safe, the usage is charged as the whole hold.
    if (!stored) this.#logger.error({ request_id: reservation.requestId }, 'settlement could not be stored; the reaper will expire the hold');
    this.#running.delete(reservation.requestId);
    if (usage.costMicros > 0) void this.#track(this.#sweeper.checkSpendSoon());
  }

  #track<T>(work: Promise<T>): Promise<T> {
    const tracked = work.finally(() => this.#background.delete(tracked));
    this.#background.add(tracked);
    return tracked;
  }
}

function reservationFrom(keyId: string, day: string, stream: string, events: readonly { type: string; data: unknown }[]): Reservation {
  const reserved = events.find((e) => e.type === 'BudgetReserved')!.data as { request_id: string; max_tokens_applied: number; clamped_by: string | null };
  return { requestId: reserved.request_id, keyId, day, stream, maxTokens: reserved.max_tokens_applied, clampedBy: reserved.clamped_by };
}
