/**
 * A periodic workflow: a rule on the passing of time, given a tick every `periodMs`. The processor
 * seeds it (a tick one period on) when it has no tick pending; each tick reads its view (`read`: a read model at
 * that time), decides its commands with the rule, and schedules the next tick on the period's grid
 * after the time it fired (a tick given late, after no process held the lease for a while, is
 * followed by one a period later, not by the ticks it missed). Ticks are kept on one stream per hour
 * (`workflow-<name>-<hour>`), so no stream grows without end; the rule keeps no state of its own.
 */
import { defineEvent, eventCatalogue, scheduleInput, Type, type Decider, type EventOf, type Rejection, type Workflow, type WorkflowCommand, type WorkflowInput } from '../src/event-sourcing/index.ts';

/** A periodic workflow's scheduled input: the tick due at `at`. */
export const PeriodicTick = defineEvent('PeriodicTick', Type.Object({ at: Type.String() }, { additionalProperties: false }));
export const periodicEvents = eventCatalogue('periodic', [PeriodicTick]);
export type PeriodicTickInput = EventOf<typeof PeriodicTick>;

/** The time a rule decides at: when the tick fired. */
export interface Tick {
  readonly now: string;
}

export interface PeriodicOptions<Command, View> {
  readonly name: string;
  readonly periodMs: number;
  readonly target: Decider<any, Command, any, Rejection<string>>;
  /** What the rule reads at a tick. */
  read(tick: Tick): Promise<View>;
  /** The rule: the commands a tick causes, given the view. */
  decide(tick: Tick, view: View): readonly WorkflowCommand<Command>[];
}

export type PeriodicWorkflow<Command, View> = Workflow<PeriodicTickInput, null, Command, View>;

export const tickTimerId = (at: string): string => `tick:${at}`;

const tickOf = (input: WorkflowInput<PeriodicTickInput>): Tick => ({ now: input.firedAt ?? input.data.at });

/** The first time on the grid `at + k × period` after `firedAt`. */
export function nextTickAt(at: string, firedAt: string, periodMs: number): string {
  const due = Date.parse(at);
  const periods = Math.max(1, Math.floor((Date.parse(firedAt) - due) / periodMs) + 1);
  return new Date(due + periods * periodMs).toISOString();
}

export function periodicWorkflow<Command, View>(options: PeriodicOptions<Command, View>): PeriodicWorkflow<Command, View> {
  const { name, periodMs, target } = options;
  if (!(periodMs > 0)) throw new Error(`${name}: the period must be positive`);
  const tick = (at: string) => scheduleInput(at, tickTimerId(at), PeriodicTick({ at }));
  return {
    name,
    inputs: periodicEvents,
    inputTypes: [],
    scheduledTypes: ['PeriodicTick'],
    target,
    instanceOf: (input) => input.data.at.slice(0, 13),
    initialState: () => null,
    read: (input) => options.read(tickOf(input)),
    decide(input, _state, view) {
      const now = tickOf(input);
      return [...options.decide(now, view), tick(nextTickAt(input.data.at, now.now, periodMs))];
    },
    evolve: (state) => state,
    seed: (now) => [tick(new Date(Date.parse(now) + periodMs).toISOString())],
  };
}
