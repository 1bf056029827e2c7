/**
 * Command handling: decide in memory, become durable alongside.
 *
 * Each stream's state is kept in memory. `decide` runs the pure decider against the latest state at
 * once (later commands on the same stream decide against the state their predecessors left, even
 * before those are stored) and hands back the outcome with a promise of durability. Appends to one
 * stream leave one at a time, each carrying every decision made while the previous one was in
 * flight, so N commands on a hot stream cost about two group-commit round trips, not N.
 *
 * When another process wrote first (a conflict), the handler reads what it missed, decides every
 * affected command again in order, and tells each caller whose decision changed (its `superseded`
 * signal fires) so that work started on the old decision can be cancelled. A decision that appends
 * nothing (a rejection, a no-op) made on top of decisions still on their way is affected too: it waits
 * in line behind them and is final only once they are stored.
 *
 * Event ids are derived from the command id and the event's index, and the command id is recorded in
 * each event's metadata: a command sent again (a lost acknowledgement, a client retry) returns its
 * original result and appends nothing twice.
 */
import { randomUUID } from 'node:crypto';
import { DuplicateEventId, WrongExpectedVersion, type AppendResult, type EventLog, type ExpectedVersion, type NewEvent, type RecordedEvent, type Subscription } from '../store/index.ts';
import { decisionEvents, schemaVersionKey, type Decider, type DomainEvent, type Rejection } from '../event-sourcing/index.ts';
import { eventIdFor } from './event-ids.ts';

export { eventIdFor } from './event-ids.ts';

/** The metadata key that names the command an event came from. */
export const commandIdKey = 'command_id';

export type Outcome<State, Event extends DomainEvent, Rej extends Rejection> =
  | {
      readonly accepted: true;
      /** The stream's state after the command's events. */
      readonly state: State;
      /** The stream's version after the command's events. */
      readonly version: number;
      /** The events the command appended (none when the decision was to do nothing). */
      readonly newEvents: readonly Event[];
      /** True when this command id had already been handled: its original events and version are returned. */
      readonly resent: boolean;
    }
  | { readonly accepted: false; readonly state: State; readonly version: number; readonly rejection: Rej };

export interface PendingDecision<State, Event extends DomainEvent, Rej extends Rejection> {
  /**
   * The decision made in memory against this process's latest state. An acceptance may start work at
   * once (cancel it on `superseded`); a rejection or a no-op made on top of decisions not stored yet is
   * not final: it is decided again if one of them loses its race, and may then append after all. Act on
   * a rejection through `durable`.
   */
  readonly outcome: Outcome<State, Event, Rej>;
  /** Fires when `outcome` turned out void and was decided differently on fresh state: cancel work started on it. */
  readonly superseded: AbortSignal;
  /**
   * The final outcome once its events are stored (a rejection or a no-op: once the decisions it was
   * made on top of are stored, at once when there were none): `outcome`, or the outcome decided again
   * after a conflict. Rejects when the store fails; the events may then or may not be stored, and
   * sending the same command id again is safe.
   */
  readonly durable: Promise<Outcome<State, Event, Rej>>;
}

export interface CommandOptions {
  /** Names the command; its events' ids derive from it (default: a fresh UUID, so no resend protection). */
  commandId?: string;
  /** Merged into every appended event's metadata (request id, key prefix, ...). */
  metadata?: Record<string, unknown>;
  /** Pin the expected version (a client's If-Match, say): a conflict then rejects `durable`, it is not decided again. */
  expectedVersion?: ExpectedVersion;
  /**
   * For a write nothing waits on at once (a settlement, say): its append may wait this long for later
   * decisions to leave with it. A decision without it sends at once what is pending on its stream and
   * what lingers on every other, so that they reach the store in one group commit.
   */
  lingerMs?: number;
}

export interface CommandHandlerOptions {
  /** The event log port: appends, streams read and the log followed; no SQL needed. */
  store: EventLog;
  /** Times one command may lose the race to another process's append before it fails (default 100). */
  maxAttempts?: number;
  /** Streams whose state is kept in memory (default 10,000; 0 keeps only streams with work under way). */
  cacheSize?: number;
  /** Events per read when loading a stream (default 1,000). */
  readPageSize?: number;
  /**
   * Command ids remembered for resend detection across every cached stream, the oldest forgotten first
   * (default 100,000), except that each stream keeps its last `recentCommandsPerStream` (default 100).
   * On SQL, a resend of one forgotten is found in its stream (see `#recall`).
   */
  recentCommands?: number;
  /** The last command ids each cached stream keeps however busy the others are (default 100). */
  recentCommandsPerStream?: number;
  /** Times an append whose outcome is unknown (a dropped connection) is sent again, same ids and version (default 2). */
  maxResends?: number;
  /** Names this process in every appended event's metadata (`origin`), so `followLog` can tell others' writes (default: a fresh UUID). */
  origin?: string;
}

/** The metadata key naming the process (handler) that appended an event. */
export const originKey = 'origin';

type AnyOutcome = Outcome<unknown, DomainEvent, Rejection>;

interface Entry {
  readonly command: unknown;
  readonly commandId: string;
  readonly options: CommandOptions;
  outcome: AnyOutcome;
  /** Made when a caller first asks for the `superseded` signal (most never do). */
  controller: AbortController | null;
  /** Why the decision turned out void, once it did. */
  voided: { reason: unknown } | null;
  attempts: number;
  resolve(outcome: AnyOutcome): void;
  reject(error: unknown): void;
}

interface Stored {
  version: number;
  events: DomainEvent[];
}

interface Slot {
  readonly streamId: string;
  readonly decider: Decider<unknown, unknown, DomainEvent, Rejection>;
  /** What the store holds, as far as this process knows. */
  confirmed: { state: unknown; version: number };
  /** `confirmed` plus every decision still on its way to the store. */
  latest: { state: unknown; version: number };
  /** Remembered command ids (`#remember`): stored (with their events) or still under way (their entry). */
  readonly recent: Map<string, Stored | Entry>;
  inflight: Entry[] | null;
  pending: Entry[];
  /** Set while the slot reads what it missed; decisions wait for it. */
  catchingUp: Promise<void> | null;
  /** Another writer may have changed the stream: catch up before the next decision. */
  stale: boolean;
  /** Pending decisions that may linger (CommandOptions.lingerMs) leave when this fires, or with the next decision (on any stream) that may not. */
  lingering: NodeJS.Timeout | null;
  /** Conflicts since this slot's last stored append. */
  conflicts: number;
}

export class CommandHandler {
  readonly #store: EventLog;
  readonly #maxAttempts: number;
  readonly #cacheSize: number;
  readonly #pageSize: number;
  readonly #recentCommands: number;
  readonly #recentPerStream: number;
  /**
   * The streams of the last `#recentCommands` commands remembered, a ring: the next command
   * remembered in a place makes the stream there forget its oldest, unless that leaves it fewer than
   * `#recentPerStream`. So a stream remembers at most that many more than its places in the ring, and
   * the process at most `#recentCommands` plus that many per cached stream: 10,000 per stream let a
   * day's busy meter streams keep millions of decided events in memory (BENCHMARKS.md, gateway).
   */
  readonly #rememberedIn: Slot[] = [];
  #remembered = 0;
  readonly #maxResends: number;
  readonly #origin: string;
  readonly #foreignListeners = new Set<(event: RecordedEvent) => void>();
  #following: Promise<Subscription> | null = null;
  readonly #slots = new Map<string, Slot>();
  readonly #loading = new Map<string, Promise<Slot>>();
  /** Durability promises of decisions still on their way to the store. */
  readonly #underway = new Set<Promise<unknown>>();
  /** Streams whose pending decisions linger (CommandOptions.lingerMs). */
  readonly #lingering = new Set<Slot>();
  /** Streams with decisions that may not linger, sent from the next turn (one setImmediate while any wait). */
  readonly #urgent = new Set<Slot>();
  /** The next urgent turn waits one more (`holdPending`). */
  #held = false;

  constructor(options: CommandHandlerOptions) {
    this.#store = options.store;
    this.#maxAttempts = options.maxAttempts ?? 100;
    this.#cacheSize = options.cacheSize ?? 10_000;
    this.#pageSize = options.readPageSize ?? 1000;
    this.#recentCommands = Math.max(1, options.recentCommands ?? 100_000);
    this.#recentPerStream = options.recentCommandsPerStream ?? 100;
    this.#maxResends = options.maxResends ?? 2;
    this.#origin = options.origin ?? randomUUID();
  }

  /**
   * Keeps the cache honest across processes: follows the global log from its head and, for every
   * event another process appended, forgets that stream (the next decision reads what it missed
   * first) and tells the listeners. One subscription per handler, whoever asks (the first caller's
   * `onError` hears its failed reads); the store's close stops it, or stop it before.
   */
  followLog(onError?: (error: unknown) => void): Promise<Subscription> {
    return (this.#following ??= this.#store.head().then((after) =>
      this.#store.subscribe({
        after,
        // This process's own events are passed over in the store, unread: its cache has them already.
        skipMetadata: { key: originKey, value: this.#origin },
        handle: async (events) => {
          for (const event of events) {
            this.forget(event.streamId);
            for (const listener of this.#foreignListeners) listener(event);
          }
        },
        onError,
      }),
    ));
  }

  /** Called with each event another process appended, once `followLog` runs. */
  onForeignEvent(listener: (event: RecordedEvent) => void): () => void {
    this.#foreignListeners.add(listener);
    return () => this.#foreignListeners.delete(listener);
  }

  /** Decides `command` in memory now; its events become durable alongside (see PendingDecision). */
  async decide<State, Command, Event extends DomainEvent, Rej extends Rejection>(
    streamId: string,
    command: Command,
    decider: Decider<State, Command, Event, Rej>,
    options: CommandOptions = {},
  ): Promise<PendingDecision<State, Event, Rej>> {
    const slot = await this.#ready(streamId, decider as Decider<unknown, unknown, DomainEvent, Rejection>);
    return this.#decideNow(slot, command, options) as PendingDecision<State, Event, Rej>;
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
    const slot = await this.#ready(streamId, decider as Decider<unknown, unknown, DomainEvent, Rejection>, options.fresh);
    return { state: slot.confirmed.state as State, version: slot.confirmed.version };
  }

  /** Another process may have written the stream: the next decision reads what it missed first. */
  forget(streamId: string): void {
    const slot = this.#slots.get(streamId);
    if (!slot) return;
    if (this.#idle(slot)) this.#slots.delete(streamId);
    else slot.stale = true;
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
      const linger = options.lingerMs ?? 0;
      if (linger <= 0) {
        // Sent from the next turn of the event loop, with what lingers on other streams (the store's
        // group commit takes all of it into this append's batch, one commit where there would have been
        // two: a key's settlement rides on the next request's reservation, whichever key that is). Not
        // at once: the caller's own work this turn (the engine call a reservation in a standing slot
        // lease starts) goes before the append's encoding.
        if (this.#urgent.size === 0) setImmediate(this.#urgentTurn);
        this.#urgent.add(slot);
      } else if (!slot.lingering) {
        slot.lingering = setTimeout(() => this.#flush(slot), linger);
        this.#lingering.add(slot);
      }
    }
    return new Decision(decided, durable, entry);
  }

  /** The turn that sends what decisions without a linger left pending, unless held for one more (`holdPending`). */
  readonly #urgentTurn = (): void => {
    if (this.#held) {
      this.#held = false;
      setImmediate(this.#urgentTurn);
    } else if (this.#urgent.size > 0) this.#flushUrgent();
  };

  /** Sends what decisions without a linger left pending, and everything lingering with it. */
  #flushUrgent(): void {
    const urgent = [...this.#urgent];
    this.#urgent.clear();
    for (const other of this.#lingering) this.#flush(other);
    for (const slot of urgent) this.#flush(slot);
  }

  /**
   * Holds the decisions made so far for one more turn of the event loop, unless `sendPending` sends them
   * first: for a caller whose own write was queued for this turn after them (undici writes a request on
   * an idle kept-alive connection from a setImmediate), so that it goes before their encoding and append.
   */
  holdPending(): void {
    if (this.#urgent.size > 0) this.#held = true;
  }

  /**
   * Sends the decisions made so far to the store now, rather than at the end of the turn: for a caller
   * whose own writes of this turn went first (the engine call a reservation starts alongside its append).
   */
  sendPending(): void {
    this.#held = false;
    if (this.#urgent.size > 0) this.#flushUrgent();
    this.#store.sendAppendsNow?.();
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
    this.#remember(slot, entry.commandId, entry);
    slot.pending.push(entry);
    return true;
  }

  /**
   * An entry's events in stored form: ids derived from its command id, its caller's metadata and ours.
   * Made when the append is sent, not when decided: a decision's caller (an engine call started in a
   * slot lease) goes on before the append's encoding.
   */
  #toAppend(slot: Slot, entry: Entry): NewEvent[] {
    if (!entry.outcome.accepted) return [];
    return entry.outcome.newEvents.map((e, i) => ({
      id: eventIdFor(entry.commandId, i),
      type: e.type,
      data: e.data,
      // Ours win over the caller's; Object.assign, not a spread followed by more keys (several times slower in V8).
      metadata: Object.assign({}, entry.options.metadata, { [commandIdKey]: entry.commandId, [originKey]: this.#origin, [schemaVersionKey]: slot.decider.events.versionOf(e.type) }),
    }));
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
    if (slot.lingering) {
      clearTimeout(slot.lingering);
      slot.lingering = null;
      this.#lingering.delete(slot);
    }
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
    const events = batch.flatMap((e) => this.#toAppend(slot, e));
    void this.#appendWithResends(slot.streamId, events, expected).then(
      (result) => this.#stored(slot, batch, result),
      (error) => this.#failed(slot, batch, error),
    );
  }

  /** An append whose outcome is unknown (connection lost) is sent again with the same ids at the same version. */
  async #appendWithResends(streamId: string, events: NewEvent[], expected: ExpectedVersion): Promise<AppendResult> {
    for (let resend = 0; ; resend++) {
      try {
        return await this.#store.append(streamId, events, expected);
      } catch (error) {
        if (error instanceof WrongExpectedVersion || error instanceof DuplicateEventId || resend >= this.#maxResends) throw error;
        await delay(50 * 4 ** resend);
      }
    }
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
      this.#slots.delete(slot.streamId); // what the store holds is unknown now: the next command reloads
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
    slot.catchingUp = (backoff ? backoff.then(() => this.#catchUp(slot)) : this.#catchUp(slot))
      .then(() => (error instanceof DuplicateEventId ? this.#recall(slot, affected) : undefined))
      .then(() => {
        slot.latest = { ...slot.confirmed };
        for (const entry of affected) this.#redecide(slot, entry, error, sent.has(entry));
      })
      .catch((readError) => {
        this.#fail(slot, affected, readError);
        this.#slots.delete(slot.streamId);
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
    if (this.#idle(slot)) this.#trimCache();
  }

  // --- loading --------------------------------------------------------------------------------

  async #ready(streamId: string, decider: Decider<unknown, unknown, DomainEvent, Rejection>, fresh = false): Promise<Slot> {
    for (let read = false; ; ) {
      const slot = this.#slots.get(streamId);
      if (slot && slot.decider !== decider) throw new Error(`stream ${streamId} is already handled with another decider`);
      if (slot) {
        if (slot.catchingUp) {
          await slot.catchingUp.catch(() => {});
          continue;
        }
        if (((fresh && !read) || slot.stale) && this.#idle(slot)) {
          slot.stale = false;
          read = true;
          slot.catchingUp = this.#catchUp(slot).finally(() => {
            slot.latest = { ...slot.confirmed };
            slot.catchingUp = null;
          });
          continue;
        }
        return slot;
      }
      let loading = this.#loading.get(streamId);
      if (!loading) {
        loading = this.#loadSlot(streamId, decider).finally(() => this.#loading.delete(streamId));
        this.#loading.set(streamId, loading);
      }
      await loading;
      read = true;
    }
  }

  async #loadSlot(streamId: string, decider: Decider<unknown, unknown, DomainEvent, Rejection>): Promise<Slot> {
    const initial = { state: decider.initialState(), version: 0 };
    const slot: Slot = { streamId, decider, confirmed: initial, latest: initial, recent: new Map(), inflight: null, pending: [], catchingUp: null, stale: false, lingering: null, conflicts: 0 };
    await this.#catchUp(slot);
    slot.latest = { ...slot.confirmed };
    this.#trimCache(); // make room first: the new slot stays at least until its first decision
    this.#slots.set(streamId, slot);
    return slot;
  }

  /** Folds the events stored after the slot's confirmed version into it, each checked by the decider's catalogue. */
  async #catchUp(slot: Slot): Promise<void> {
    let { state, version } = slot.confirmed;
    for (;;) {
      const page = await this.#store.readStream(slot.streamId, { fromVersion: version + 1, limit: this.#pageSize });
      for (const recorded of page.events) {
        const event = slot.decider.events.parse(recorded);
        state = slot.decider.evolve(state, event);
        const commandId = recorded.metadata?.[commandIdKey];
        if (typeof commandId === 'string') this.#rememberStored(slot, commandId, event, recorded.streamVersion);
        version = recorded.streamVersion;
      }
      if (page.events.length < this.#pageSize) {
        version = Math.max(version, page.version);
        break;
      }
    }
    slot.confirmed = { state, version };
  }

  /** Remembers a command (under way or stored) in its stream's slot; see `#rememberedIn` for what it forgets. */
  #remember(slot: Slot, commandId: string, value: Stored | Entry): void {
    slot.recent.delete(commandId);
    const at = this.#remembered++ % this.#recentCommands;
    if (at < this.#rememberedIn.length) {
      const forgetting = this.#rememberedIn[at];
      if (forgetting.recent.size > this.#recentPerStream) forgetting.recent.delete(forgetting.recent.keys().next().value as string);
    }
    this.#rememberedIn[at] = slot;
    slot.recent.set(commandId, value); // last in the map's order
  }

  /**
   * After a `DuplicateEventId`: a command whose events the store holds already, though this process
   * no longer remembers it (a resend of a command decided long ago). Its events are looked up in its
   * stream and remembered, so that it resolves as resent (`#redecide`) instead of being decided again.
   */
  async #recall(slot: Slot, entries: readonly Entry[]): Promise<void> {
    const missing = new Set(entries.filter((entry) => !slot.recent.has(entry.commandId)).map((entry) => entry.commandId));
    if (missing.size === 0) return;
    for (let from = 1; from <= slot.confirmed.version; from += this.#pageSize) {
      const page = await this.#store.readStream(slot.streamId, { fromVersion: from, limit: this.#pageSize });
      for (const recorded of page.events) {
        const commandId = recorded.metadata?.[commandIdKey];
        if (typeof commandId === 'string' && missing.has(commandId)) this.#rememberStored(slot, commandId, slot.decider.events.parse(recorded), recorded.streamVersion);
      }
      if (page.events.length < this.#pageSize) break;
    }
  }

  /** Folds a stored event into what the slot remembers of its command (one command's events may span pages). */
  #rememberStored(slot: Slot, commandId: string, event: DomainEvent, streamVersion: number): void {
    const known = slot.recent.get(commandId);
    if (known && !('commandId' in known) && known.version < streamVersion) {
      known.events.push(event);
      known.version = streamVersion;
    } else this.#remember(slot, commandId, { version: streamVersion, events: [event] });
  }

  #idle(slot: Slot): boolean {
    return !slot.inflight && slot.pending.length === 0 && !slot.catchingUp;
  }

  /** Drops the least recently loaded idle streams beyond the cache size. */
  #trimCache(): void {
    if (this.#slots.size <= this.#cacheSize) return;
    for (const [id, slot] of this.#slots) {
      if (this.#slots.size <= this.#cacheSize) break;
      if (this.#idle(slot)) this.#slots.delete(id);
    }
  }
}

/** The reason a decision's `superseded` signal fires. */
export class DecisionSuperseded extends Error {
  override name = 'DecisionSuperseded';
  constructor(readonly streamId: string) {
    super(`another process changed stream ${streamId} first; the command was decided again`);
  }
}

const neverSuperseded = new AbortController().signal;

/** The entry's `superseded` signal, made on first use (aborted at once if the decision was voided already). */
/**
 * A decision under way, as `decide` returns it. A class, for its getter: an object literal with a
 * getter (`{ get superseded() { ... } }`) takes a hidden class of its own each time it is made, made in
 * V8's old generation, and that keeps the whole decision (its command, events, the caller's closures)
 * alive through every scavenge until the next full collection. That was about 1 KB promoted per
 * command, and most of a metered request's scavenge cost (BENCHMARKS.md, gateway).
 */
class Decision implements PendingDecision<unknown, DomainEvent, Rejection> {
  readonly #entry: Entry;
  constructor(
    readonly outcome: AnyOutcome,
    readonly durable: Promise<AnyOutcome>,
    entry: Entry,
  ) {
    this.#entry = entry;
  }

  get superseded(): AbortSignal {
    return supersededSignal(this.#entry);
  }
}

function supersededSignal(entry: Entry): AbortSignal {
  if (!entry.controller) {
    entry.controller = new AbortController();
    if (entry.voided) entry.controller.abort(entry.voided.reason);
  }
  return entry.controller.signal;
}

function supersede(entry: Entry, reason: unknown): void {
  if (entry.voided) return;
  entry.voided = { reason };
  entry.controller?.abort(reason);
}

/** Whether the entry's outcome appends events (a rejection or a no-op does not); made into stored form when sent (`#toAppend`). */
function appends(entry: Entry): boolean {
  return entry.outcome.accepted && entry.outcome.newEvents.length > 0;
}

function durableOf(entry: Entry): Promise<AnyOutcome> {
  return new Promise((resolve, reject) => {
    const { resolve: r0, reject: j0 } = entry;
    entry.resolve = (o) => {
      r0(o);
      resolve(o);
    };
    entry.reject = (e) => {
      j0(e);
      reject(e);
    };
  });
}

/** Two outcomes decide the same thing when they reject alike or append the same events. */
function sameDecision(a: AnyOutcome, b: AnyOutcome): boolean {
  if (a.accepted !== b.accepted) return false;
  if (!a.accepted || !b.accepted) return !a.accepted && !b.accepted && a.rejection.rejected === b.rejection.rejected && JSON.stringify(a.rejection) === JSON.stringify(b.rejection);
  return JSON.stringify(a.newEvents) === JSON.stringify(b.newEvents);
}

function delay(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}
