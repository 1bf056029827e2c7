import type { EventLog, ExpectedVersion } from '../store/index.ts';
import type { DomainEvent, Rejection } from '../event-sourcing/index.ts';

/** The metadata key that names the command an event came from. */
export const commandIdKey = 'command_id';

/** The metadata key naming the process (handler) that appended an event. */
export const originKey = 'origin';

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
   * On SQL, a resend of one forgotten is found in its stream (see `StreamCache.recall`).
   */
  recentCommands?: number;
  /** The last command ids each cached stream keeps however busy the others are (default 100). */
  recentCommandsPerStream?: number;
  /** Times an append whose outcome is unknown (a dropped connection) is sent again, same ids and version (default 2). */
  maxResends?: number;
  /** Names this process in every appended event's metadata (`origin`), so `followLog` can tell others' writes (default: a fresh UUID). */
  origin?: string;
}
