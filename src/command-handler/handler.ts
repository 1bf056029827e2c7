/**
 * The command handler: decides in memory against each stream's latest state and sends the decisions
 * to the store, one append per stream at a time, deciding again after a conflict (see index.ts).
 */
import { randomUUID } from 'node:crypto';
import { DuplicateEventId, WrongExpectedVersion, type AppendResult, type EventLog, type Subscription } from '../store/index.ts';
import { decisionEvents, type Decider, type DomainEvent, type Rejection } from '../event-sourcing/index.ts';
import { appendWithResends, toAppend } from './append.ts';
import { type CommandHandlerOptions, type CommandOptions, type Outcome, type PendingDecision } from './types.ts';
import { appends, Decision, DecisionSuperseded, delay, durableOf, idle, neverSuperseded, sameDecision, supersede, type AnyOutcome, type Entry, type Slot, type Stored } from './slot.ts';
import { ResendIds } from './resend-ids.ts';
import { StreamCache } from './stream-cache.ts';
import { FlushSchedule, type PendingAppends } from './flush-schedule.ts';
import { ForeignEventBus, type ForeignEventListener } from './event-bus.ts';

type AnyDecider = Decider<unknown, unknown, DomainEvent, Rejection>;

export class CommandHandler {
  readonly #store: EventLog;
  readonly #maxAttempts: number;
  readonly #maxResends: number;
  readonly #origin: string;
  readonly #resendIds: ResendIds;
  readonly #cache: StreamCache;
  readonly #schedule: FlushSchedule;
  readonly #bus: ForeignEventBus;
  /** Durability promises of decisions still on their way to the store. */
  readonly #underway = new Set<Promise<unknown>>();

  constructor(options: CommandHandlerOptions) {
    this.#store = options.store;
    this.#maxAttempts = options.maxAttempts ?? 100;
    this.#maxResends = options.maxResends ?? 2;
    this.#origin = options.origin ?? randomUUID();
    this.#resendIds = new ResendIds(options);
    this.#cache = new StreamCache({ store: this.#store, resendIds: this.#resendIds, cacheSize: options.cacheSize ?? 10_000, readPageSize: options.readPageSize ?? 1000 });
    this.#schedule = new FlushSchedule(
      (slot) => this.#flush(slot),
      () => this.#store.sendAppendsNow?.(),
    );
    this.#bus = new ForeignEventBus(this.#store, this.#origin, (streamId) => this.forget(streamId));
  }

  /** When the decisions made so far leave for the store, for a caller whose own write must be ordered against them. */
  get pendingAppends(): PendingAppends {
    return this.#schedule;
  }

  /**
   * Keeps the cache honest across processes: follows the global log from its head and, for every
   * event another process appended, forgets that stream (the next decision reads what it missed
   * first) and tells the listeners. One subscription per handler, whoever asks (the first caller's
   * `onError` hears its failed reads); the store's close stops it, or stop it before.
   */
  followLog(onError?: (error: unknown) => void): Promise<Subscription> {
    return this.#bus.follow(onError);
  }

  /** Called with each event another process appended, once `followLog` runs. */
  onForeignEvent(listener: ForeignEventListener): () => void {
    return this.#bus.listen(listener);
  }

  /** Decides `command` in memory now; its events become durable alongside (see PendingDecision). */
  async decide<State, Command, Event extends DomainEvent, Rej extends Rejection>(
    streamId: string,
    command: Command,
    decider: Decider<State, Command, Event, Rej>,
    options: CommandOptions = {},
  ): Promise<PendingDecision<State, Event, Rej>> {
    const decided = await this.#cache.ready(streamId, decider as AnyDecider, false, (slot) => this.#decideNow(slot, command, options));
    return decided as PendingDecision<State, Event, Rej>;
  }

  /** Decides `command` and waits until its outcome is durable. */
  async handle<State, Command, Event extends DomainEvent, Rej extends Rejection>(
    streamId: string,
    command: Command,
    decider: Decider<State, Command, Event, Rej>,
    options: CommandOptions = {},
  ): Promise<Outcome<State, Event, Rej>> {
    return (await this.decide(streamId, command, decider, options)).durable;
  }

  /** The stream's stored state and version, as this process knows it (`fresh`: read what others appended first). */
  async load<State, Event extends DomainEvent>(
    streamId: string,
    decider: Decider<State, never, Event, Rejection>,
    options: { fresh?: boolean } = {},
  ): Promise<{ state: State; version: number }> {
    const { state, version } = await this.#cache.ready(streamId, decider as AnyDecider, options.fresh ?? false, (slot) => slot.confirmed);
    return { state: state as State, version };
  }

  /** Another process may have written the stream: the next decision reads what it missed first. */
  forget(streamId: string): void {
    this.#cache.forget(streamId);
  }

  /** Resolves once every decision under way has reached the store (or failed): call it before closing the store. */
  async settled(): Promise<void> {
    while (this.#underway.size > 0) await Promise.allSettled([...this.#underway]);
  }

  // --- deciding -------------------------------------------------------------------------------

  #decideNow(slot: Slot, command: unknown, options: CommandOptions): PendingDecision<unknown, DomainEvent, Rejection> {
    const commandId = options.commandId ?? randomUUID();
    const seen = slot.recent.get(commandId);
    if (seen) return this.#resentDecision(slot, seen);

    let resolve!: (o: AnyOutcome) => void;
    let reject!: (e: unknown) => void;
    const durable = new Promise<AnyOutcome>((res, rej) => {
      resolve = res;
      reject = rej;
    });
    durable.catch(() => {}); // a caller that only looks at `outcome` must not leave an unhandled rejection
    const entry: Entry = { command, commandId, options, outcome: null as unknown as AnyOutcome, controller: null, voided: null, attempts: 0, resolve, reject };
    const queued = this.#decideEntry(slot, entry);
    const decided = entry.outcome;
    if (!queued) entry.resolve(decided);
    else {
      const tracked = durable.catch(() => {}).finally(() => this.#underway.delete(tracked));
      this.#underway.add(tracked);
      this.#schedule.schedule(slot, options.lingerMs ?? 0);
    }
    return new Decision(decided, durable, entry);
  }

  /**
   * Runs the decider for `entry` against the slot's latest state and queues it behind the decisions
   * still on their way to the store. True when queued: it has events to append, or it appends nothing
   * (a rejection, a no-op) but was decided on top of decisions not yet stored. Such a decision is final
   * only once they are: one of them may lose its race and be decided differently, and a refusal
   * counted against a start that never happened must be decided again (`#failed`), not answered.
   */
  #decideEntry(slot: Slot, entry: Entry): boolean {
    const { state, version } = slot.latest;
    const decided = decisionEvents(slot.decider.decide(entry.command, state));
    if (!Array.isArray(decided)) {
      entry.outcome = { accepted: false, state, version, rejection: decided as Rejection };
      return this.#queueBehindUnstored(slot, entry);
    }
    const events = (decided as readonly DomainEvent[]).map((e) => slot.decider.events.check(e));
    let next = state;
    for (const event of events) next = slot.decider.evolve(next, event);
    entry.outcome = { accepted: true, state: next, version: version + events.length, newEvents: events, resent: false };
    if (events.length === 0) return this.#queueBehindUnstored(slot, entry);
    slot.latest = { state: next, version: version + events.length };
    this.#resendIds.remember(slot, entry.commandId, entry);
    slot.pending.push(entry);
    return true;
  }

  /** Queues a decision that appends nothing when decisions it was made on top of are not stored yet. */
  #queueBehindUnstored(slot: Slot, entry: Entry): boolean {
    if (!slot.inflight && slot.pending.length === 0) return false;
    slot.pending.push(entry);
    return true;
  }

  #resentDecision(slot: Slot, seen: Stored | Entry): PendingDecision<unknown, DomainEvent, Rejection> {
    const asResent = (o: AnyOutcome): AnyOutcome => (o.accepted ? { ...o, resent: true } : o);
    if ('commandId' in seen) {
      // The same command is still on its way to the store in this process: share its fate.
      return new Decision(asResent(seen.outcome), durableOf(seen).then(asResent), seen);
    }
    const outcome: AnyOutcome = { accepted: true, state: slot.latest.state, version: seen.version, newEvents: seen.events, resent: true };
    return { outcome, superseded: neverSuperseded, durable: Promise.resolve(outcome) };
  }

  // --- becoming durable -----------------------------------------------------------------------

  #flush(slot: Slot): void {
    this.#schedule.sending(slot);
    if (slot.inflight || slot.catchingUp) return;
    // Decisions that append nothing, first in line, were made on what is stored now: they are final.
    let final = 0;
    while (final < slot.pending.length && !appends(slot.pending[final])) final++;
    for (const entry of slot.pending.splice(0, final)) entry.resolve(entry.outcome);
    if (slot.pending.length === 0) return;
    // One append at a time per stream; it takes every decision made meanwhile, up to a pinned one (sent alone).
    const pinnedAt = slot.pending.findIndex((e) => e.options.expectedVersion !== undefined);
    const batch = pinnedAt === 0 ? slot.pending.splice(0, 1) : slot.pending.splice(0, pinnedAt < 0 ? slot.pending.length : pinnedAt);
    slot.inflight = batch;
    const expected = batch[0].options.expectedVersion ?? slot.confirmed.version;
    const events = batch.flatMap((e) => toAppend(slot, e, this.#origin));
    void appendWithResends(this.#store, slot.streamId, events, expected, this.#maxResends).then(
      (result) => this.#stored(slot, batch, result),
      (error) => this.#failed(slot, batch, error),
    );
  }

  #stored(slot: Slot, batch: Entry[], result: AppendResult): void {
    slot.inflight = null;
    // Nothing decided on top of this batch: the state it leaves is the latest, evolved already when
    // its decisions were made. Else it is evolved again from the confirmed state.
    const latest = slot.pending.length === 0 && slot.latest.version === result.nextExpectedVersion;
    let state = latest ? slot.latest.state : slot.confirmed.state;
    for (const entry of batch) {
      if (!entry.outcome.accepted) continue;
      if (!latest) for (const event of entry.outcome.newEvents) state = slot.decider.evolve(state, event);
      // In its entry's place, unless that was forgotten meanwhile.
      if (slot.recent.get(entry.commandId) === entry) slot.recent.set(entry.commandId, { version: entry.outcome.version, events: [...entry.outcome.newEvents] });
    }
    slot.confirmed = { state, version: result.nextExpectedVersion };
    slot.conflicts = 0;
    // The store already held exactly these ids here: a resend of commands decided the same way before.
    for (const entry of batch) entry.resolve(result.idempotent && entry.outcome.accepted ? { ...entry.outcome, resent: true } : entry.outcome);
    this.#afterWork(slot);
  }

  #failed(slot: Slot, batch: Entry[], error: unknown): void {
    slot.inflight = null;
    const conflict = error instanceof WrongExpectedVersion || error instanceof DuplicateEventId;
    if (!conflict) {
      // The store keeps failing: these entries and those decided on top of them fail.
      this.#fail(slot, [...batch, ...slot.pending], error);
      slot.pending = [];
      this.#cache.drop(slot.streamId); // what the store holds is unknown now: the next command reloads
      return;
    }
    // A pinned command's conflict is its caller's to handle; the commands decided after it are decided again.
    const pinned = batch[0].options.expectedVersion !== undefined;
    if (pinned) this.#fail(slot, batch, error);
    // Another process wrote first: read what it wrote, then decide again, in order, on the fresh state.
    // Only the commands that were sent lost a race (those still pending never reached the store).
    const sent = new Set(pinned ? [] : batch.filter(appends));
    const affected = pinned ? slot.pending : [...batch, ...slot.pending];
    slot.pending = [];
    for (const entry of affected) slot.recent.delete(entry.commandId);
    // Two processes that keep writing one stream would keep colliding in step: after a second
    // conflict in a row, wait a random moment (up to 2, 4, ... 64 ms) so one of them gets ahead.
    slot.conflicts++;
    const backoff = slot.conflicts < 2 ? null : delay(Math.random() * 2 ** Math.min(slot.conflicts - 1, 6));
    slot.catchingUp = (backoff ? backoff.then(() => this.#cache.catchUp(slot)) : this.#cache.catchUp(slot))
      .then(() => (error instanceof DuplicateEventId ? this.#cache.recall(slot, affected) : undefined))
      .then(() => {
        slot.latest = { ...slot.confirmed };
        for (const entry of affected) this.#redecide(slot, entry, error, sent.has(entry));
      })
      .catch((readError) => {
        this.#fail(slot, affected, readError);
        this.#cache.drop(slot.streamId);
      })
      .finally(() => {
        slot.catchingUp = null;
        this.#afterWork(slot);
      });
  }

  #fail(slot: Slot, entries: Entry[], error: unknown): void {
    for (const entry of entries) {
      slot.recent.delete(entry.commandId);
      supersede(entry, error);
      entry.reject(error);
    }
  }

  #redecide(slot: Slot, entry: Entry, cause: unknown, lostRace: boolean): void {
    const stored = slot.recent.get(entry.commandId);
    if (stored && !('commandId' in stored)) {
      // Its events were stored after all (an earlier attempt whose acknowledgement was lost).
      entry.resolve({ accepted: true, state: slot.latest.state, version: stored.version, newEvents: stored.events, resent: true });
      return;
    }
    if (lostRace) entry.attempts++;
    if (entry.attempts >= this.#maxAttempts) {
      this.#fail(slot, [entry], cause);
      return;
    }
    const before = entry.outcome;
    const queued = this.#decideEntry(slot, entry);
    if (!sameDecision(before, entry.outcome)) supersede(entry, new DecisionSuperseded(slot.streamId));
    if (!queued) entry.resolve(entry.outcome);
  }

  #afterWork(slot: Slot): void {
    this.#flush(slot);
    if (idle(slot)) this.#cache.trim();
  }
}
