/**
 * Deciders in Emmett's shape: pure functions over readonly unions, time and ids passed in on the
 * command. A decision is events (possibly none) or a rejection value; nothing is thrown for a rule.
 */
import type { DomainEvent, EventCatalogue } from './events.ts';

/** A rule said no. `rejected` is a domain code, mapped to the API's error catalogue in one place. */
export interface Rejection<Code extends string = string> {
  readonly rejected: Code;
  readonly message: string;
  /** Facts a caller may need (which budget, when to retry, ...). */
  readonly details?: Readonly<Record<string, unknown>>;
}

export function reject<const Code extends string>(rejected: Code, message: string, details?: Record<string, unknown>): Rejection<Code> {
  return details === undefined ? { rejected, message } : { rejected, message, details };
}

export function isRejection(value: unknown): value is Rejection {
  return typeof value === 'object' && value !== null && typeof (value as Rejection).rejected === 'string';
}

export type Decision<Event extends DomainEvent, Rej extends Rejection> = Event | readonly Event[] | Rej;

export interface Decider<State, Command, Event extends DomainEvent, Rej extends Rejection = never> {
  /** The stream category's events: the handler checks every stored event against it before `evolve`. */
  readonly events: EventCatalogue<Event>;
  initialState(): State;
  evolve(state: State, event: Event): State;
  /** The events the command causes (none: nothing is appended), or a rejection. */
  decide(command: Command, state: State): Decision<Event, Rej>;
}

/** A decision's events as an array, or the rejection. */
export function decisionEvents<Event extends DomainEvent, Rej extends Rejection>(decision: Decision<Event, Rej>): readonly Event[] | Rej {
  if (Array.isArray(decision)) return decision as readonly Event[];
  if (isRejection(decision)) return decision as Rej;
  return [decision as Event];
}

export function foldEvents<State, Event extends DomainEvent>(decider: Pick<Decider<State, never, Event, never>, 'evolve'>, state: State, events: readonly Event[]): State {
  let next = state;
  for (const event of events) next = decider.evolve(next, event);
  return next;
}
