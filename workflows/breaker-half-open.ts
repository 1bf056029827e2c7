/**
 * The breakers' timed half-open: a breaker that opened is half-opened when its cooldown is over, so
 * /health and backend_health say `half_open` when no request comes (until then a request that finds
 * the cooldown over half-opens it itself, StartProbe). One instance per backend stream follows the
 * breaker's state from its events; each opening schedules a `HalfOpenDue` at its `retry_at`, under a
 * timer id derived from the opening; when it fires, `halfOpenBreakers` (deciders/backend.ts, the rule)
 * judges the breaker as the instance knows it, and the backend decider judges again on the stream.
 */
import { defineEvent, eventCatalogue, scheduleInput, Type, type EventOf, type Workflow, type WorkflowInput } from '../src/event-sourcing/index.ts';
import { BreakerClosed, BreakerHalfOpened, BreakerOpened, ProbeStarted, backendStreamParts, type BackendEvent } from '../events/backend.ts';
import { backendDecider, halfOpenBreakers, type BackendCommand, type BackendState } from '../deciders/backend.ts';

/** The scheduled input: the cooldown of the opening at `opened_at` on `backend_stream` is over. */
export const HalfOpenDue = defineEvent('HalfOpenDue', Type.Object({ backend_stream: Type.String(), opened_at: Type.String() }, { additionalProperties: false }));

const breakerEvents = eventCatalogue('breaker-half-open', [BreakerOpened, BreakerHalfOpened, ProbeStarted, BreakerClosed, HalfOpenDue]);

export type BreakerInput = Extract<BackendEvent, { type: 'BreakerOpened' | 'BreakerHalfOpened' | 'ProbeStarted' | 'BreakerClosed' }> | EventOf<typeof HalfOpenDue>;
type HalfOpen = Extract<BackendCommand, { type: 'HalfOpen' }>;

const instanceOf = (input: WorkflowInput<BreakerInput>): string => (input.type === 'HalfOpenDue' ? input.data.backend_stream : input.streamId);

export const breakerHalfOpenWorkflow: Workflow<BreakerInput, BackendState, HalfOpen> = {
  name: 'breaker-half-open',
  inputs: breakerEvents,
  inputTypes: ['BreakerOpened', 'BreakerHalfOpened', 'ProbeStarted', 'BreakerClosed'],
  scheduledTypes: ['HalfOpenDue'],
  target: backendDecider,
  instanceOf,
  initialState: () => backendDecider.initialState(),
  decide(input, state) {
    if (input.type === 'BreakerOpened') {
      const { retry_at: retryAt, at } = input.data;
      return [scheduleInput(retryAt, `half-open:${input.streamId}:${at}`, HalfOpenDue({ backend_stream: input.streamId, opened_at: at }))];
    }
    if (input.type !== 'HalfOpenDue') return [];
    const parts = backendStreamParts(input.data.backend_stream);
    if (!parts) return [];
    return halfOpenBreakers({ now: input.firedAt ?? state.retryAt ?? input.data.opened_at }, [{ ...parts, state }]);
  },
  evolve(state, message) {
    if (message.kind === 'output' || message.input.type === 'HalfOpenDue') return state;
    return backendDecider.evolve(state, message.input);
  },
};
