/**
 * The per-key FIFO of requests waiting for one of the key's active slots.
 *
 * The contract's "64 queued per key" holds across gateway processes because the bound is the meter
 * decider's: a waiter is recorded on the key's meter before it waits (Queue → RequestQueued, refused
 * `queue_full` at the bound) and leaves it with its reservation (BudgetReserved) or with LeaveQueue
 * when it gives up. Entries are renewed while they wait, so a dead process's entries lapse after
 * their TTL. A request that gets a slot at once never comes here: the hot path appends nothing more.
 */
import type { Logger } from 'pino';
import { apiError } from '../errors/index.ts';
import type { CommandHandler, PendingDecision } from '../command-handler/index.ts';
import { meterDayAfterRefusal, meterDecider, type MeterCommand, type MeterRejection, type MeterState } from '../../deciders/index.ts';
import { meterStream, utcDay, type MeterEvent } from '../../events/index.ts';

/** What the queue needs of a request (src/metering/index.ts, AdmitRequest). */
export interface QueueableRequest {
  readonly keyId: string;
  readonly facts: { readonly request_id: string };
  readonly limits: { readonly maxQueued: number };
  /** The client left: the request leaves the queue. */
  readonly signal: AbortSignal;
}

export interface RequestQueueOptions<Request extends QueueableRequest, Admitted> {
  handler: CommandHandler;
  logger: Logger;
  /** This process's name on its queue entries. */
  holder: string;
  /** An entry not renewed for this long lapses (its process died); renewed once half of it is left. */
  entryTtlMs: number;
  /** One reservation attempt: the admission, or null while every active slot of the key is taken. */
  tryReserve(request: Request): Promise<Admitted | null>;
  /** The contract's error for a meter rejection. */
  refusal(rejection: MeterRejection): Error;
  /**
   * Lets go of an admission made for a request that stopped waiting while it was being made (its client
   * left, the queue closed): nobody runs or settles it, so it must not stay held.
   */
  release(request: Request, admitted: Admitted): void;
  /** Keeps background work in sight of the service's stop(). */
  track<T>(work: Promise<T>): Promise<T>;
  now(): Date;
  /** How often waiters try again without a wake-up (a slot freed by another process's reaper, a lost hint). */
  retryMs?: number;
}

interface Waiter<Request, Admitted> {
  readonly request: Request;
  /** The meter day whose stream holds the entry (the next day carries it once that one closes). */
  day: string;
  /** When the entry lapses unless renewed (epoch ms). */
  expiresAt: number;
  resolve(admitted: Admitted): void;
  reject(error: unknown): void;
  /** A reservation attempt for it is under way (wake): a refusal of its entry waits for the attempt's result. */
  attempting: boolean;
  /** Its entry's refusal that came while an attempt was under way (undefined: none). */
  refused?: unknown;
}

interface Line<Request, Admitted> {
  readonly waiters: Waiter<Request, Admitted>[];
  busy: boolean;
}

type Decision = PendingDecision<MeterState, MeterEvent, MeterRejection>;

const leftQueue = () => new DOMException('the client left the queue', 'AbortError');

export class RequestQueue<Request extends QueueableRequest, Admitted> {
  readonly #options: RequestQueueOptions<Request, Admitted>;
  readonly #lines = new Map<string, Line<Request, Admitted>>();
  /** Set by close(): what a request that would wait from then on is refused with. */
  #closed: Error | null = null;

  constructor(options: RequestQueueOptions<Request, Admitted>) {
    this.#options = options;
  }

  /** The key's requests waiting in this process. */
  waiting(keyId: string): number {
    return this.#lines.get(keyId)?.waiters.length ?? 0;
  }

  /** Requests waiting in this process, every key's (for /metrics). */
  waitingTotal(): number {
    let n = 0;
    for (const line of this.#lines.values()) n += line.waiters.length;
    return n;
  }

  /** Requests waiting in this process per key, the keys with any (for /metrics). */
  waitingByKey(): Map<string, number> {
    const byKey = new Map<string, number>();
    for (const [keyId, line] of this.#lines) if (line.waiters.length > 0) byKey.set(keyId, line.waiters.length);
    return byKey;
  }

  /** Records that the request waits (or refuses it `queue_full`), then waits, first come first served, for a slot. */
  async enqueue(request: Request): Promise<Admitted> {
    if (request.signal.aborted) throw leftQueue();
    // Closed (the process is stopping): nothing would wake it but a slot freed by the requests still
    // running, and stop() waits for what it holds (a reservation sent back here by a conflict, say).
    if (this.#closed) throw this.#closed;
    const { holder, entryTtlMs } = this.#options;
    const now = this.#options.now();
    const command: MeterCommand = { type: 'Queue', requestId: request.facts.request_id, holder, maxQueued: request.limits.maxQueued, ttlMs: entryTtlMs, now: now.toISOString() };
    const { day, decision, outcome } = await this.#decide(request.keyId, utcDay(now), command).catch((error: unknown) => {
      this.#options.logger.error({ err: String(error), request_id: request.facts.request_id }, 'a queue entry could not be stored');
      throw apiError('store_unavailable', 'the usage store is unavailable; the request was not run');
    });
    if (!outcome.accepted) throw this.#options.refusal(outcome.rejection);
    let line = this.#lines.get(request.keyId);
    if (!line) this.#lines.set(request.keyId, (line = { waiters: [], busy: false }));
    const waiters = line.waiters;
    return new Promise<Admitted>((resolve, reject) => {
      const leave = () => {
        if (this.#drop(waiters, waiter)) this.#leave(waiter);
        reject(leftQueue());
      };
      const unlisten = () => request.signal.removeEventListener('abort', leave);
      const waiter: Waiter<Request, Admitted> = {
        request,
        day,
        expiresAt: now.getTime() + entryTtlMs,
        resolve: (admitted) => {
          unlisten();
          resolve(admitted);
        },
        reject: (error) => {
          unlisten();
          reject(error);
        },
        attempting: false,
      };
      waiters.push(waiter);
      if (request.signal.aborted) return leave();
      if (this.#closed) {
        // Closed while its entry was decided: it leaves the meter's queue again, refused like the others.
        if (this.#drop(waiters, waiter)) this.#leave(waiter);
        return waiter.reject(this.#closed);
      }
      request.signal.addEventListener('abort', leave, { once: true });
      // Decided in memory; stored otherwise when another process filled the queue first: then refused.
      decision.durable.then(
        (final) => {
          if (final.accepted) return;
          if (final.rejection.rejected === 'meter_closed') waiter.expiresAt = 0; // queued again on the next day at the next retry
          else this.#refuse(waiters, waiter, this.#options.refusal(final.rejection));
        },
        (error: unknown) => {
          this.#options.logger.error({ err: String(error), request_id: request.facts.request_id }, 'a queue entry could not be stored');
          this.#refuse(waiters, waiter, apiError('store_unavailable', 'the usage store is unavailable; the request was not run'));
        },
      );
      this.#scheduleRetry(request.keyId);
    });
  }

  /** Lets the key's waiting requests try again, first come first served, until one finds no slot. */
  wake(keyId: string): void {
    const line = this.#lines.get(keyId);
    if (!line || line.waiters.length === 0 || line.busy) return;
    line.busy = true;
    const waiters = line.waiters;
    void this.#options.track(
      (async () => {
        try {
          await this.#renew(keyId, waiters);
          while (waiters.length > 0) {
            const waiter = waiters[0];
            let admitted: Admitted | null;
            // The attempt takes a few turns (the day's rollover, the key's re-check, a conflict's catch-up):
            // the waiter may stop waiting meanwhile. A refusal of its entry waits for the attempt (see #refuse).
            waiter.attempting = true;
            try {
              admitted = await this.#options.tryReserve(waiter.request);
            } catch (error) {
              if (this.#drop(waiters, waiter)) this.#leave(waiter);
              waiter.reject(error);
              continue;
            } finally {
              waiter.attempting = false;
            }
            if (!admitted) {
              // No slot, and its entry was refused meanwhile: it stops waiting now.
              if (waiter.refused !== undefined && this.#drop(waiters, waiter)) waiter.reject(waiter.refused);
              break;
            }
            // Its reservation took its entry off the meter's queue. A waiter that left meanwhile (its
            // client gone, the queue closed) has been answered: nobody would run or settle this
            // reservation, and its process would renew the hold for as long as it lives.
            if (!this.#drop(waiters, waiter)) {
              this.#options.release(waiter.request, admitted);
              continue;
            }
            // A refusal of its entry that came meanwhile no longer matters: it waits no more, it runs.
            waiter.resolve(admitted);
          }
        } finally {
          line.busy = false;
          if (waiters.length === 0) this.#lines.delete(keyId);
          else this.#scheduleRetry(keyId);
        }
      })(),
    );
  }

  /** Refuses every waiting request (the process is stopping) and takes their entries off the meter. */
  close(error: Error): void {
    this.#closed = error;
    for (const line of this.#lines.values()) {
      for (const waiter of line.waiters.splice(0)) {
        this.#leave(waiter);
        waiter.reject(error);
      }
    }
    this.#lines.clear();
  }

  #scheduleRetry(keyId: string): void {
    setTimeout(() => this.wake(keyId), this.#options.retryMs ?? 250).unref();
  }

  /**
   * Its entry was refused once stored (another process filled the queue first, or the store failed):
   * it stops waiting, refused. While a reservation attempt for it is under way, the attempt decides
   * instead: a reservation made runs (its entry no longer matters), no slot refuses it then.
   */
  #refuse(waiters: Waiter<Request, Admitted>[], waiter: Waiter<Request, Admitted>, error: unknown): void {
    if (waiter.attempting) waiter.refused = error;
    else if (this.#drop(waiters, waiter)) waiter.reject(error);
  }

  /** Takes the waiter out of its line; false when it had left already. */
  #drop(waiters: Waiter<Request, Admitted>[], waiter: Waiter<Request, Admitted>): boolean {
    const at = waiters.indexOf(waiter);
    if (at < 0) return false;
    waiters.splice(at, 1);
    return true;
  }

  #leave(waiter: Waiter<Request, Admitted>): void {
    const command: MeterCommand = { type: 'LeaveQueue', requestId: waiter.request.facts.request_id, now: this.#options.now().toISOString() };
    void this.#options.track(
      this.#decide(waiter.request.keyId, waiter.day, command)
        .then(({ decision }) => decision.durable)
        .catch((error) => this.#options.logger.warn({ err: String(error), request_id: waiter.request.facts.request_id }, 'leaving the queue could not be stored; the entry lapses')),
    );
  }

  /**
   * Renews the entries of the key's waiters once half their TTL is gone (at the retry cadence, so a
   * handful of appends per TTL); an entry that lapsed meanwhile (a stalled process, a lost append) is
   * queued again, and refused `queue_full` if others took its room.
   */
  async #renew(keyId: string, waiters: Waiter<Request, Admitted>[]): Promise<void> {
    const { holder, entryTtlMs, logger } = this.#options;
    const now = this.#options.now();
    const due = waiters.filter((w) => w.expiresAt - now.getTime() < entryTtlMs / 2);
    const days = new Set(due.map((w) => w.day));
    for (const day of days) {
      const ofDay = due.filter((w) => w.day === day);
      const renew: MeterCommand = { type: 'RenewQueued', holder, requestIds: ofDay.map((w) => w.request.facts.request_id), ttlMs: entryTtlMs, now: now.toISOString() };
      try {
        const renewed = await this.#decide(keyId, day, renew);
        const outcome = await renewed.decision.durable;
        if (!outcome.accepted) continue;
        for (const waiter of ofDay) {
          waiter.day = renewed.day;
          const entry = outcome.state.queue[waiter.request.facts.request_id];
          const expiresAt = entry?.holder === holder ? Date.parse(entry.expiresAt) : 0;
          if (expiresAt > now.getTime()) waiter.expiresAt = expiresAt;
          else if (waiters.includes(waiter)) await this.#requeue(waiters, waiter, now);
        }
      } catch (error) {
        logger.warn({ err: String(error), key_id: keyId }, 'renewing queue entries failed; trying again at the next retry');
      }
    }
  }

  async #requeue(waiters: Waiter<Request, Admitted>[], waiter: Waiter<Request, Admitted>, now: Date): Promise<void> {
    const { holder, entryTtlMs } = this.#options;
    const request = waiter.request;
    const command: MeterCommand = { type: 'Queue', requestId: request.facts.request_id, holder, maxQueued: request.limits.maxQueued, ttlMs: entryTtlMs, now: now.toISOString() };
    const queued = await this.#decide(request.keyId, waiter.day, command);
    const outcome = await queued.decision.durable;
    if (outcome.accepted) {
      waiter.day = queued.day;
      waiter.expiresAt = now.getTime() + entryTtlMs;
    } else if (this.#drop(waiters, waiter)) waiter.reject(this.#options.refusal(outcome.rejection));
  }

  /**
   * Decides a queue command on the key's meter of `day`; on the next day's when that one closed (it
   * carried the queue), on the previous day's when this one is not opened yet (it will carry it).
   */
  async #decide(keyId: string, day: string, command: MeterCommand): Promise<{ day: string; decision: Decision; outcome: Decision['outcome'] }> {
    for (let tries = 0; ; tries++) {
      const decision = await this.#options.handler.decide(meterStream(keyId, day), command, meterDecider);
      // A refusal is final once the decisions it was made on top of are stored (see Metering's reservations).
      const outcome = decision.outcome.accepted ? decision.outcome : await decision.durable;
      // (a day not opened yet is tried only first: the previous day it then goes to is opened)
      if (!outcome.accepted && tries < 2 && (tries === 0 || outcome.rejection.rejected !== 'meter_not_opened')) {
        const elsewhere = meterDayAfterRefusal(outcome.rejection, day);
        if (elsewhere !== null) {
          day = elsewhere;
          continue;
        }
      }
      return { day, decision, outcome };
    }
  }
}
