/**
 * Command handling: load a stream, run a pure decider, append with the expected version, and on a
 * conflict reload and decide again. Commands on one stream are serialized inside the process, and
 * each stream's state is cached, so conflicts only come from other processes.
 */
import { randomUUID } from 'node:crypto';
import { WrongExpectedVersion, type AppendResult, type EventStore, type ExpectedVersion, type NewEvent } from '../store/index.ts';

/** An event as a decider sees it: the store's ids and metadata ride along but deciders need not set them. */
export interface DecidedEvent {
  type: string;
  data: unknown;
  /** Set it (from the command) to make a repeated command append nothing twice; otherwise a fresh UUID. */
  id?: string;
  metadata?: Record<string, unknown>;
}

/** Emmett-style decider: three pure functions, no I/O, time and ids passed in on the command. */
export interface Decider<State, Command, Event extends DecidedEvent> {
  initialState(): State;
  evolve(state: State, event: Event): State;
  /** Returns the events the command causes (none: nothing is appended) or throws a domain rejection. */
  decide(command: Command, state: State): Event | readonly Event[];
}

export interface HandleOptions {
  /** Pin the expected version (a client's If-Match, say): a conflict is then returned, not retried. */
  expectedVersion?: ExpectedVersion;
  /** Merged into every appended event's metadata (request id, key prefix, ...). */
  metadata?: Record<string, unknown>;
}

export interface HandleResult<State, Event> {
  /** The stream's state after the command's events. */
  state: State;
  /** The events the command appended (empty when the decision was to do nothing). */
  newEvents: Event[];
  /** The stream's version after the command. */
  version: number;
  /** The store's answer; null when nothing was appended. */
  appended: AppendResult | null;
}

export interface CommandHandlerOptions {
  store: EventStore;
  /** Read-decide-append attempts before a conflict is given up on (default 10). */
  maxAttempts?: number;
  /** Streams whose state is kept in memory (default 10,000; 0 disables the cache). */
  cacheSize?: number;
  /** Events per read when loading a stream (default 1,000). */
  readPageSize?: number;
}

interface Loaded {
  decider: unknown;
  state: unknown;
  version: number;
}

export class CommandHandler {
  readonly #store: EventStore;
  readonly #maxAttempts: number;
  readonly #cacheSize: number;
  readonly #pageSize: number;
  readonly #cache = new Map<string, Loaded>();
  readonly #queues = new Map<string, Promise<unknown>>();

  constructor(options: CommandHandlerOptions) {
    this.#store = options.store;
    this.#maxAttempts = options.maxAttempts ?? 10;
    this.#cacheSize = options.cacheSize ?? 10_000;
    this.#pageSize = options.readPageSize ?? 1000;
  }

  /** Decides `command` against the stream's current state and appends the result. */
  handle<State, Command, Event extends DecidedEvent>(
    streamId: string,
    command: Command,
    decider: Decider<State, Command, Event>,
    options: HandleOptions = {},
  ): Promise<HandleResult<State, Event>> {
    return this.#exclusive(streamId, () => this.#handle(streamId, command, decider, options));
  }

  /** The stream's current state and version (from the cache when this process has it). */
  load<State, Event extends DecidedEvent>(streamId: string, decider: Decider<State, never, Event>): Promise<{ state: State; version: number }> {
    return this.#exclusive(streamId, async () => {
      const loaded = await this.#load(streamId, decider, this.#cached(streamId, decider));
      return { state: loaded.state as State, version: loaded.version };
    });
  }

  /** Drops a stream's cached state: the next command reads it from the store. */
  forget(streamId: string): void {
    this.#cache.delete(streamId);
  }

  async #handle<State, Command, Event extends DecidedEvent>(
    streamId: string,
    command: Command,
    decider: Decider<State, Command, Event>,
    options: HandleOptions,
  ): Promise<HandleResult<State, Event>> {
    let current = this.#cached(streamId, decider);
    for (let attempt = 1; ; attempt++) {
      current = await this.#load(streamId, decider, current);
      const state = current.state as State;
      const decided = decider.decide(command, state);
      const newEvents: Event[] = Array.isArray(decided) ? [...(decided as readonly Event[])] : [decided as Event];
      if (newEvents.length === 0) return { state, newEvents, version: current.version, appended: null };

      const toAppend: NewEvent[] = newEvents.map((e) => ({
        id: e.id ?? randomUUID(),
        type: e.type,
        data: e.data,
        metadata: options.metadata || e.metadata ? { ...e.metadata, ...options.metadata } : undefined,
      }));
      try {
        const appended = await this.#store.append(streamId, toAppend, options.expectedVersion ?? current.version);
        const next = newEvents.reduce((s, e) => decider.evolve(s, e), state);
        this.#remember(streamId, { decider, state: next, version: appended.nextExpectedVersion });
        return { state: next, newEvents, version: appended.nextExpectedVersion, appended };
      } catch (error) {
        this.#cache.delete(streamId);
        const retry = error instanceof WrongExpectedVersion && options.expectedVersion === undefined && attempt < this.#maxAttempts;
        if (!retry) throw error;
        // Another process wrote first: catch up from where we were and decide again.
        await new Promise((r) => setTimeout(r, Math.random() * 5 * attempt));
      }
    }
  }

  #cached(streamId: string, decider: unknown): Loaded | null {
    const hit = this.#cache.get(streamId);
    return hit && hit.decider === decider ? hit : null;
  }

  /** Folds the stream into state; with a previous state, only the events after it are read. */
  async #load<State, Event extends DecidedEvent>(
    streamId: string,
    decider: Decider<State, never, Event>,
    from: Loaded | null,
  ): Promise<Loaded> {
    if (from && this.#cache.get(streamId) === from) return from; // still current: nothing else writes this stream here
    let state = (from ? from.state : decider.initialState()) as State;
    let version = from ? from.version : 0;
    for (;;) {
      const page = await this.#store.readStream(streamId, { fromVersion: version + 1, limit: this.#pageSize });
      for (const e of page.events) state = decider.evolve(state, { id: e.id, type: e.type, data: e.data, metadata: e.metadata } as Event);
      if (page.events.length > 0) version = page.events[page.events.length - 1].streamVersion;
      if (page.events.length < this.#pageSize) {
        version = Math.max(version, page.version);
        break;
      }
    }
    const loaded = { decider, state, version };
    this.#remember(streamId, loaded);
    return loaded;
  }

  #remember(streamId: string, loaded: Loaded): void {
    if (this.#cacheSize <= 0) return;
    this.#cache.delete(streamId); // re-insert: the Map's order is the recency order
    this.#cache.set(streamId, loaded);
    if (this.#cache.size > this.#cacheSize) this.#cache.delete(this.#cache.keys().next().value as string);
  }

  #exclusive<T>(streamId: string, fn: () => Promise<T>): Promise<T> {
    const previous = this.#queues.get(streamId) ?? Promise.resolve();
    const run = previous.then(fn);
    const tail = run.catch(() => {});
    this.#queues.set(streamId, tail);
    void tail.then(() => {
      if (this.#queues.get(streamId) === tail) this.#queues.delete(streamId);
    });
    return run;
  }
}

export function createCommandHandler(options: CommandHandlerOptions): CommandHandler {
  return new CommandHandler(options);
}
