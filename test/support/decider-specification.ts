/**
 * Given / when / then for deciders, after Emmett's DeciderSpecification:
 *   spec.given([issued]).when(pause).then([paused])
 *   spec.given([revoked]).when(reserve).thenRejects('key_revoked')
 * Given events are checked against the decider's catalogue, so a fixture cannot drift from the schemas.
 */
import * as assert from 'uvu/assert';
import { decisionEvents, foldEvents, isRejection, type Decider, type DomainEvent, type Rejection } from '../../src/event-sourcing/index.ts';

export interface Then<State, Event extends DomainEvent, Rej extends Rejection> {
  then(expected: readonly Event[]): void;
  thenNothing(): void;
  thenRejects(code: Rej['rejected'], details?: Record<string, unknown>): Rej;
  /** The decision's events folded onto the given state. */
  thenState(check: (state: State) => void): void;
}

export function deciderSpecification<State, Command, Event extends DomainEvent, Rej extends Rejection>(decider: Decider<State, Command, Event, Rej>) {
  return {
    given(events: readonly Event[] = []) {
      for (const event of events) decider.events.check(event);
      const state = foldEvents(decider, decider.initialState(), events);
      return {
        when(command: Command): Then<State, Event, Rej> {
          const decided = decisionEvents(decider.decide(command, state));
          const accepted = (): readonly Event[] => {
            if (isRejection(decided)) assert.unreachable(`expected events, got rejection ${decided.rejected}: ${decided.message}`);
            return decided as readonly Event[];
          };
          return {
            then(expected) {
              const events = accepted();
              for (const event of events) decider.events.check(event);
              assert.equal(events, expected);
            },
            thenNothing() {
              assert.equal(accepted(), []);
            },
            thenRejects(code, details) {
              if (!isRejection(decided)) assert.unreachable(`expected rejection ${code}, got events ${JSON.stringify(decided)}`);
              const rejection = decided as Rej;
              assert.is(rejection.rejected, code, rejection.message);
              if (details) for (const [k, v] of Object.entries(details)) assert.equal(rejection.details?.[k], v, `details.${k}`);
              return rejection;
            },
            thenState(check) {
              check(foldEvents(decider, state, accepted()));
            },
          };
        },
      };
    },
  };
}
