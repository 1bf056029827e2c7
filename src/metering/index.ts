/**
 * Metering: reserve before the engine runs, settle with its real usage, expire holds whose request
 * died. Decisions are the meter decider's (commands/meter.ts), made in memory through the command
 * handler; concurrent reservations on one key leave in one append. A reservation that fits in this
 * process's standing slot lease lets the engine start at once, alongside its append; one that takes
 * or grows the lease waits for the append first (see SlotsLeased in events/meter.ts).
 *
 * Per key and UTC day one meter stream, opened with the month-to-date balance of the key's previous
 * meter day (walked back within the month), so a key's load never reads more than one day.
 */
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import { apiError, ApiError } from '../errors/index.ts';
import type { CommandHandler } from '../command-handler/index.ts';
import type { EventStore } from '../store/index.ts';
import { balanceFrom, meterDecider, reapHolds, secondsUntilUtcTurn, spendDecider, watchSpend, type KeyStatus, type MeterCommand, type MeterRejection } from '../../commands/index.ts';
import { expiredHolds, spendOfDay } from '../../projections/index.ts';
import { meterStream, meterStreamParts, utcDay, type KeyBudgetValues, type MeterOpening, type RequestFactsData } from '../../events/index.ts';
import { RequestQueue } from './queue.ts';

/** The key as metering needs it, read again at every (re)decision: the reservation re-check. */
export interface MeteredKey {
  keyId: string;
  status: KeyStatus;
  budgets: KeyBudgetValues;
}

export interface AdmitRequest {
  key: () => Promise<MeteredKey>;
  /** The key's id (the queue it waits in). */
  keyId: string;
  facts: RequestFactsData;
  inputTokens: number;
  maxTokens: number;
  maxTokensRequested: number | null;
  choices: number;
  limits: { maxActive: number; maxQueued: number; perMinute: number };
  /** The client left: a waiting request leaves the queue. */
  signal: AbortSignal;
}

export interface Reservation {
  readonly requestId: string;
  readonly keyId: string;
  /** The meter day (and stream) the hold is on. */
  readonly day: string;
  readonly stream: string;
  readonly maxTokens: number;
  /** The budget that lowered max_tokens, or null. */
  readonly clampedBy: string | null;
}

export interface Admission extends Reservation {
  /**
   * True when the reservation fits in this process's standing slot lease: the engine may be called
   * now, alongside the append (no byte may reach the client before `durable` resolves). False: call
   * it once `durable` resolves.
   */
  readonly startNow: boolean;
  /** Aborted when this reservation was decided again and came out otherwise: cancel an engine call started on it. */
  readonly voided: AbortSignal;
  /** The reservation as stored: this one, or the one decided again on fresh state (rejects with an ApiError). */
  readonly durable: Promise<Reservation>;
}

/** What a settlement records besides the request's facts: the meter decider's Settle command, less its envelope. */
export type Usage = Omit<Extract<MeterCommand, { type: 'Settle' }>, 'type' | 'facts' | 'now'>;

/** The usage of a request answered before it reached the engine (its reservation was not confirmed). */
const notRun: Usage = { inputTokens: 0, outputTokens: 0, status: 503, latencyMs: 0, gpuSeconds: 0, cost: 0, disconnected: false };

export interface MeteringOptions {
  handler: CommandHandler;
  store: EventStore;
  logger: Logger;
  /** A hold whose request died is expired this long after it was made or last renewed. */
  reservationTtlMs: number;
  /** Past this day's GPU spend the whole service answers 429 spend_cap until the next UTC day; null: no cap. */
  dailySpendCap: number | null;
  /** How often the reaper and the spend check run (default: a quarter of the TTL, at most 15 s). */
  sweepIntervalMs?: number;
  /**
   * How long a settlement's (or a refused request's record's) append may wait for later decisions on
   * the key's meter to leave with it (default 5 ms): decided in memory at once, it is written off the
   * path of the client's next request rather than in front of it.
   */
  settleLingerMs?: number;
  /**
   * How long a slot lease stands without a reservation renewing it (default: 60 s, or the TTL when
   * shorter): the longest a process keeps an idle slot of a key (or, if it died, the idle slots of
   * its lease) from the other processes. Its holds last the reservation TTL either way.
   */
  slotLeaseTtlMs?: number;
  now?: () => Date;
}

export class Metering {
  readonly #handler: CommandHandler;
  readonly #store: EventStore;
  readonly #logger: Logger;
  readonly #ttlMs: number;
  readonly #spendCap: number | null;
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
  readonly #opening = new Map<string, Promise<void>>();
  readonly #background = new Set<Promise<unknown>>();
  #spendCappedDay: string | null = null;
  #timer: NodeJS.Timeout | null = null;
  /** Aborted by stop(): writes being tried again give up. */
  readonly #stopping = new AbortController();
  #unlisten: (() => void) | null = null;

  constructor(options: MeteringOptions) {
    this.#handler = options.handler;
    this.#store = options.store;
    this.#logger = options.logger;
    this.#ttlMs = options.reservationTtlMs;
    this.#spendCap = options.dailySpendCap;
    this.#sweepMs = options.sweepIntervalMs ?? Math.min(15_000, Math.max(50, Math.floor(options.reservationTtlMs / 4)));
    this.#lingerMs = options.settleLingerMs ?? 5;
    this.#leaseTtlMs = options.slotLeaseTtlMs ?? Math.min(60_000, options.reservationTtlMs);
    this.#now = options.now ?? (() => new Date());
    this.#queue = new RequestQueue<AdmitRequest, Admission>({
      handler: this.#handler,
      logger: this.#logger,
      holder: this.#holder,
      entryTtlMs: this.#leaseTtlMs,
      tryReserve: (request) => this.#tryReserve(request),
      refusal: rejectionToApiError,
      track: (work) => this.#track(work),
      now: this.#now,
    });
  }

  /** Starts the reaper, the renewals and the spend check, and wakes waiting requests on other processes' meter writes. */
  start(): void {
    this.#unlisten = this.#handler.onForeignEvent((event) => {
      if (event.type === 'SpendCapReached') this.#spendCappedDay = (event.data as { day: string }).day;
      const match = /^meter-(.+)-\d{4}-\d{2}-\d{2}$/.exec(event.streamId);
      if (match) this.#wake(match[1]);
    });
    const tick = () => {
      this.#track(this.#sweep()).finally(() => {
        if (this.#timer) this.#timer = setTimeout(tick, this.#sweepMs).unref();
      });
    };
    this.#timer = setTimeout(tick, this.#sweepMs).unref();
  }

  /** Stops the timers and waits for settlements and records under way. */
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
    if (this.#spendCappedDay === utcDay(now)) {
      throw apiError('spend_cap', 'the service has reached its daily GPU spend cap; it resumes at the next UTC day', { retryAfter: secondsUntilUtcTurn(now.getTime(), 'day') });
    }
    if (this.#queue.waiting(request.keyId) === 0) {
      const admitted = await this.#tryReserve(request);
      if (admitted) return admitted;
    }
    return this.#enqueue(request);
  }

  /** Settles a reservation with the engine's real usage and releases the hold (also a hold carried into today). */
  settle(reservation: Reservation, facts: RequestFactsData, usage: Usage): Promise<void> {
    return this.#track(this.#settle(reservation, facts, usage));
  }

  /** Records a request refused after authentication (metadata only). Not awaited by the response. */
  recordRejection(keyId: string, facts: RequestFactsData, code: string, status: number, inputTokens: number, latencyMs: number): void {
    const now = this.#now();
    void this.#track(
      this.#handler
        .handle(meterStream(keyId, utcDay(now)), { type: 'RecordRejection', facts, code, status, inputTokens, latencyMs, now: now.toISOString() }, meterDecider, {
          commandId: `rejected:${facts.request_id}`,
          metadata: { request_id: facts.request_id },
          lingerMs: this.#lingerMs,
        })
        .catch((error) => this.#logger.error({ err: String(error), request_id: facts.request_id }, 'recording a rejected request failed')),
    );
  }

  // --- admission ------------------------------------------------------------------------------

  /**
   * One reservation attempt: an Admission, or null when the key's active slots are all taken. `day`
   * is today's, unless today's meter was already closed by a process whose clock passed midnight first.
   */
  async #tryReserve(request: AdmitRequest, nextDayOf?: string): Promise<Admission | null> {
    const now = this.#now();
    const day = nextDayOf ? nextDay(nextDayOf) : utcDay(now);
    const keyId = request.keyId;
    const stream = meterStream(keyId, day);
    await this.#ensureOpened(keyId, day, now);
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
        limits: { maxActive: request.limits.maxActive, perMinute: request.limits.perMinute },
        ttlMs: this.#ttlMs,
        lease: { holder: this.#holder, ttlMs: this.#leaseTtlMs },
        now: now.toISOString(),
      },
      meterDecider,
      { commandId: `reserve:${request.facts.request_id}`, metadata: { request_id: request.facts.request_id } },
    );
    const outcome = decision.outcome;
    if (!outcome.accepted) {
      if (outcome.rejection.rejected === 'at_capacity') return null;
      if (outcome.rejection.rejected === 'meter_closed') return this.#tryReserve(request, day);
      throw rejectionToApiError(outcome.rejection);
    }
    const reservation = reservationFrom(keyId, day, stream, outcome.newEvents);
    // In the lease as it stands (renewed alongside at most): no other process can take this slot, so the engine may start now.
    const startNow = outcome.newEvents.every((e) => e.type !== 'SlotsLeased') && outcome.newEvents.some((e) => e.type === 'BudgetReserved' && e.data.lease_holder !== null);
    const voiding = new AbortController();
    this.#running.set(reservation.requestId, { expiresAt: now.getTime() + this.#ttlMs, ...reservation });
    const durable = decision.durable.then(
      async (final): Promise<Reservation> => {
        if (final.accepted) {
          const stored = reservationFrom(keyId, day, stream, final.newEvents);
          if (stored.maxTokens !== reservation.maxTokens) voiding.abort();
          this.#running.set(stored.requestId, { expiresAt: now.getTime() + this.#ttlMs, ...stored });
          return stored;
        }
        voiding.abort();
        this.#running.delete(reservation.requestId);
        // Decided again on fresh state and refused: wait for a slot like any other request, or fail.
        if (final.rejection.rejected === 'at_capacity') return (await this.#enqueue(request)).durable;
        if (final.rejection.rejected === 'meter_closed') {
          const onNextDay = await this.#tryReserve(request, day);
          return (onNextDay ?? (await this.#enqueue(request))).durable;
        }
        throw rejectionToApiError(final.rejection);
      },
      (error: unknown) => {
        voiding.abort();
        this.#logger.error({ err: String(error), request_id: request.facts.request_id }, 'reservation could not be stored');
        // The append's outcome may be unknown (its connection broke after the commit): release the hold
        // it may have stored, at zero usage, instead of leaving it to the reaper (which charges it whole).
        void this.#track(this.#settle(reservation, request.facts, notRun));
        throw apiError('store_unavailable', 'the usage store is unavailable; the request was not run');
      },
    );
    return { startNow, voided: voiding.signal, durable, ...reservation };
  }

  #enqueue(request: AdmitRequest): Promise<Admission> {
    return this.#queue.enqueue(request);
  }

  /** Lets the key's waiting requests try again (a slot may have freed). */
  #wake(keyId: string): void {
    this.#queue.wake(keyId);
  }

  // --- the day's meter ------------------------------------------------------------------------

  #ensureOpened(keyId: string, day: string, now: Date): Promise<void> {
    const stream = meterStream(keyId, day);
    let opening = this.#opening.get(stream);
    if (!opening) {
      opening = (async () => {
        const { state } = await this.#handler.load(stream, meterDecider);
        if (state.opened) return;
        const balance = await this.#openingBalance(keyId, day, now);
        await this.#handler.handle(stream, { type: 'OpenMeter', opening: balance, now: now.toISOString() }, meterDecider);
      })().finally(() => this.#opening.delete(stream));
      this.#opening.set(stream, opening);
    }
    return opening;
  }

  /**
   * The opening balance: from the key's latest meter day of the last 31, which is closed first (so no
   * reservation can land there unseen once its balance is read). Another month's day carries only
   * its running holds and recent starts (they take active slots and count against the rate), not its tokens.
   * Which of the 31 days have a meter is one read; only those are loaded, latest first.
   */
  async #openingBalance(keyId: string, day: string, now: Date): Promise<MeterOpening> {
    const date = Date.parse(`${day}T00:00:00Z`);
    const earlierDays = Array.from({ length: 31 }, (_, i) => new Date(date - (i + 1) * 86_400_000).toISOString().slice(0, 10));
    const versions = await this.#store.streamVersions(earlierDays.map((d) => meterStream(keyId, d)));
    for (const earlier of earlierDays) {
      const stream = meterStream(keyId, earlier);
      if (!versions.get(stream)) continue;
      const { state } = await this.#handler.load(stream, meterDecider, { fresh: true });
      if (!state.opened) continue;
      const closed = await this.#handler.handle(stream, { type: 'CloseMeter', nextDay: day, now: now.toISOString() }, meterDecider);
      return balanceFrom(keyId, day, earlier, closed.state, now.getTime());
    }
    return { key_id: keyId, day, month_input_tokens: 0, month_output_tokens: 0, carried_from: null, carried_holds: [], carried_leases: [], recent_starts: [] };
  }

  // --- settling, expiring ---------------------------------------------------------------------

  async #settle(reservation: Reservation, facts: RequestFactsData, usage: Usage): Promise<void> {
    const now = this.#now();
    // The hold stays renewed while the settlement is tried again: the real usage is known here.
    const stored = await this.#persist(async () => {
      const decision = await this.#handler.decide(
        reservation.stream,
        { type: 'Settle', facts, lease: { holder: this.#holder, waiting: this.#queue.waiting(reservation.keyId) }, now: now.toISOString(), ...usage },
        meterDecider,
        { commandId: `settle:${reservation.requestId}`, metadata: { request_id: reservation.requestId }, lingerMs: this.#lingerMs },
      );
      // Decided, the slot is free in memory: a request waiting here takes it now, not once the lingering
      // append is stored (its reservation's append takes this one along).
      this.#wake(reservation.keyId);
      // A hold carried into a later day is released there by the carried-holds workflow (commands/carried-holds.ts).
      await decision.durable;
    }, reservation.requestId, 'settlement');
    // Not stored: the hold stays until the reaper expires it; the budget stays safe, the usage is charged as the whole hold.
    if (!stored) this.#logger.error({ request_id: reservation.requestId }, 'settlement could not be stored; the reaper will expire the hold');
    this.#running.delete(reservation.requestId);
    if (usage.cost > 0) void this.#track(this.#checkSpend());
  }

  /**
   * Runs a meter write that must survive a passing store failure: tried again with the same command
   * ids (so it is stored at most once) after 0.25, 0.5, 1, ... s, until it is stored, half the hold's
   * TTL has passed, or the process stops. True once stored.
   */
  async #persist(write: () => Promise<unknown>, requestId: string, what: string): Promise<boolean> {
    const giveUpAt = Date.now() + this.#ttlMs / 2;
    for (let pause = 250; ; pause *= 2) {
      try {
        await write();
        return true;
      } catch (error) {
        if (this.#stopping.signal.aborted || Date.now() + pause > giveUpAt) return false;
        this.#logger.warn({ err: String(error), request_id: requestId }, `${what} could not be stored yet; trying again`);
        const stopped = await sleep(pause, false, { signal: this.#stopping.signal }).catch(() => true);
        if (stopped) return false;
      }
    }
  }

  /** Renews the holds of requests still running here; expires holds whose request died (anywhere). */
  async #sweep(): Promise<void> {
    const now = this.#now();
    for (const running of this.#running.values()) {
      if (running.expiresAt - now.getTime() > this.#ttlMs / 2) continue;
      const expiresAt = now.getTime() + this.#ttlMs;
      try {
        await this.#handler.handle(running.stream, { type: 'Renew', requestId: running.requestId, expiresAt: new Date(expiresAt).toISOString(), now: now.toISOString() }, meterDecider);
        running.expiresAt = expiresAt;
      } catch (error) {
        this.#logger.error({ err: String(error), request_id: running.requestId }, 'renewing a hold failed');
      }
    }
    await this.#reap(now).catch((error) => this.#logger.error({ err: String(error) }, 'reaper pass failed'));
    await this.#checkSpend().catch((error) => this.#logger.error({ err: String(error) }, 'spend check failed'));
  }

  /** The reaper (commands/timed-workflows.ts): holds past their expiry, from the meter_holds projection, expired. */
  async #reap(now: Date): Promise<void> {
    const expired = await expiredHolds(this.#store, now, 500);
    for (const { stream, command, commandId } of reapHolds({ now: now.toISOString() }, { expired, runningHere: new Set(this.#running.keys()) })) {
      const outcome = await this.#handler.handle(stream, command, meterDecider, { commandId });
      if (outcome.accepted && outcome.newEvents.length > 0) {
        const keyId = meterStreamParts(stream)!.keyId;
        this.#logger.warn({ request_id: command.requestId, key_id: keyId }, 'reservation expired: its request died with its process');
        this.#wake(keyId);
      }
    }
  }

  /** The spend watcher (commands/timed-workflows.ts): the day's spend, from the daily_spend projection, reported to the spend decider. */
  async #checkSpend(): Promise<void> {
    const now = this.#now();
    const view = { cap: this.#spendCap, reachedDay: this.#spendCappedDay, spend: 0 };
    if (view.cap === null || view.reachedDay === utcDay(now)) return;
    view.spend = (await spendOfDay(this.#store, utcDay(now))).cost;
    for (const { stream, command, commandId } of watchSpend({ now: now.toISOString() }, view)) {
      const outcome = await this.#handler.handle(stream, command, spendDecider, { commandId });
      if (!outcome.accepted || !outcome.state.reached) continue;
      this.#spendCappedDay = command.day;
      if (outcome.newEvents.length > 0) {
        this.#logger.warn({ day: command.day, spend: command.spend, cap: command.cap }, 'daily GPU spend cap reached: the service answers 429 spend_cap until the next UTC day');
      }
    }
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

function nextDay(day: string): string {
  return new Date(Date.parse(`${day}T00:00:00Z`) + 86_400_000).toISOString().slice(0, 10);
}

/** The one place meter rejections become the contract's errors. */
export function rejectionToApiError(rejection: MeterRejection): ApiError {
  switch (rejection.rejected) {
    case 'key_inactive':
      return apiError('invalid_api_key', `the API key is ${String(rejection.details?.status ?? 'not active')}`, { status: 403 });
    case 'rate_limited':
      return apiError('rate_limited', rejection.message, { retryAfter: Number(rejection.details?.retry_after_seconds ?? 1) });
    case 'budget_exceeded':
      return apiError('budget_exceeded', rejection.message, { fields: { budget: rejection.details?.budget }, retryAfter: Number(rejection.details?.retry_after_seconds ?? 60) });
    case 'at_capacity':
    case 'queue_full':
      return apiError('queue_full', rejection.message);
    case 'duplicate_request':
      return apiError('invalid_request', 'X-Request-Id is already in use by a running request of this key');
    case 'meter_not_opened':
    case 'meter_closed':
      return new ApiError('internal_error', 'internal error');
  }
}

