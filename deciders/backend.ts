/**
 * The backend decider: one engine's circuit breaker and its boot stages (stream `backend-<modelId>`,
 * or `backend-<modelId>:activation` for a separate activation engine; events/backend.ts).
 *
 * closed --N failures in a row--> open --cooldown over--> half_open --probe succeeds--> closed
 *                                   ^                         |
 *                                   +----probe fails----------+
 *
 * The threshold, the cooldown and the probe's lease come in on the commands (configuration), the time
 * too. Half-open lets exactly one probe through: `StartProbe` is decided against the stream, so of
 * two processes racing for it one appends ProbeStarted and the other, decided again on the fresh
 * state after its append conflicts, is refused. Nothing is appended unless something changes: a
 * success on a closed breaker with no failures appends nothing.
 */
import { later } from '../events/shapes.ts';
import { reject, type Decider, type Rejection, type WorkflowCommand } from '../src/event-sourcing/index.ts';
import {
  BackendFailed,
  BackendFailuresCleared,
  backendEvents,
  BootStagePublished,
  BreakerClosed,
  BreakerHalfOpened,
  BreakerOpened,
  ProbeStarted,
  type BackendEvent,
  type BackendKind,
  type BootStage,
  backendStream,
} from '../events/backend.ts';

export type BreakerStatus = 'closed' | 'open' | 'half_open';

export interface BackendState {
  readonly breaker: BreakerStatus;
  readonly consecutiveFailures: number;
  readonly lastFailureKind: string | null;
  readonly lastFailureAt: string | null;
  /** While open or half-open: when it opened. */
  readonly openedAt: string | null;
  /** While open: when the cooldown ends and one probe may go. */
  readonly retryAt: string | null;
  /** While half-open: the probe under way, if one is. */
  readonly probe: { readonly id: string; readonly expiresAt: string } | null;
  /** The last boot stage published. */
  readonly boot: { readonly stage: BootStage; readonly at: string; readonly reason: string | null } | null;
}

export type BackendCommand =
  | { type: 'RecordFailure'; backend: BackendKind; kind: string; now: string; failureThreshold: number; cooldownMs: number; probeId?: string | null }
  | { type: 'RecordSuccess'; backend: BackendKind; now: string; probeId?: string | null }
  | { type: 'HalfOpen'; backend: BackendKind; now: string }
  | { type: 'StartProbe'; backend: BackendKind; probeId: string; now: string; probeLeaseMs: number }
  | { type: 'PublishBootStage'; backend: BackendKind; stage: BootStage; now: string; reason?: string | null };

/**
 * `circuit_open`: still cooling down; `probe_in_flight`: another request is the probe; both carry
 * `retry_at`. `breaker_closed`: no probe needed, requests flow.
 */
export type BackendRejection = Rejection<'circuit_open' | 'probe_in_flight' | 'breaker_closed'>;

const initialState: BackendState = { breaker: 'closed', consecutiveFailures: 0, lastFailureKind: null, lastFailureAt: null, openedAt: null, retryAt: null, probe: null, boot: null };

const reached = (now: string, at: string): boolean => Date.parse(now) >= Date.parse(at);

// The rules below are the decider's, exported so that the backends service's hot path asks them
// before it sends a command (and sends none when nothing would change), never a copy of them.

/** The request is the half-open breaker's probe under way. */
const isTheProbe = (state: BackendState, probeId: string | null | undefined): boolean =>
  state.breaker === 'half_open' && state.probe !== null && probeId != null && probeId === state.probe.id;

/**
 * May a request go to the engine as the breaker stands at `now`? `flow`: closed, requests go (no
 * probe needed); `probe`: the cooldown is over (or the last probe's lease ran out) and this request may
 * become the probe, decided against the stream (StartProbe); otherwise refused until `retryAt`:
 * still cooling down (`circuit_open`) or another request probing (`probe_in_flight`).
 */
export type BreakerAdmission = { verdict: 'flow' } | { verdict: 'probe' } | { verdict: 'circuit_open' | 'probe_in_flight'; retryAt: string };
export function breakerAdmission(state: BackendState, now: string): BreakerAdmission {
  if (state.breaker === 'closed') return { verdict: 'flow' };
  if (state.breaker === 'open') return state.retryAt !== null && !reached(now, state.retryAt) ? { verdict: 'circuit_open', retryAt: state.retryAt } : { verdict: 'probe' };
  return state.probe !== null && !reached(now, state.probe.expiresAt) ? { verdict: 'probe_in_flight', retryAt: state.probe.expiresAt } : { verdict: 'probe' };
}

/** Does a failure count? On a closed breaker, every one; open or half-open, only the probe's. */
export const failureCounts = (state: BackendState, probeId: string | null | undefined): boolean => state.breaker === 'closed' || isTheProbe(state, probeId);

/** Does a success change anything? On a closed breaker, only after failures; otherwise only the probe's (it closes it). */
export const successCounts = (state: BackendState, probeId: string | null | undefined): boolean =>
  state.breaker === 'closed' ? state.consecutiveFailures > 0 : isTheProbe(state, probeId);

export const backendDecider: Decider<BackendState, BackendCommand, BackendEvent, BackendRejection> = {
  events: backendEvents,
  initialState: () => initialState,
  evolve(state, event) {
    switch (event.type) {
      case 'BackendFailed':
        return { ...state, consecutiveFailures: event.data.consecutive_failures, lastFailureKind: event.data.kind, lastFailureAt: event.data.at };
      case 'BackendFailuresCleared':
        return { ...state, consecutiveFailures: 0 };
      case 'BreakerOpened':
        return { ...state, breaker: 'open', consecutiveFailures: event.data.consecutive_failures, openedAt: event.data.at, retryAt: event.data.retry_at, probe: null };
      case 'BreakerHalfOpened':
        return { ...state, breaker: 'half_open', retryAt: null, probe: null };
      case 'ProbeStarted':
        return { ...state, breaker: 'half_open', retryAt: null, probe: { id: event.data.probe_id, expiresAt: event.data.expires_at } };
      case 'BreakerClosed':
        return { ...state, breaker: 'closed', consecutiveFailures: 0, openedAt: null, retryAt: null, probe: null };
      case 'BootStagePublished':
        return { ...state, boot: { stage: event.data.stage, at: event.data.at, reason: event.data.reason ?? null } };
    }
  },
  decide(command, state) {
    const { backend, now: at } = command;
    switch (command.type) {
      case 'RecordFailure': {
        const consecutive = state.consecutiveFailures + 1;
        const failed = BackendFailed({ backend, kind: command.kind, consecutive_failures: consecutive, at });
        const opened = (reason: 'failures' | 'probe_failed') =>
          BreakerOpened({
            backend,
            reason,
            consecutive_failures: consecutive,
            last_failure_kind: command.kind,
            failure_threshold: command.failureThreshold,
            cooldown_ms: command.cooldownMs,
            retry_at: later(at, command.cooldownMs),
            at,
          });
        // Open or half-open, only the probe's outcome counts: a request that started before the breaker
        // opened and fails now tells nothing new.
        if (!failureCounts(state, command.probeId)) return [];
        if (state.breaker === 'closed') return consecutive >= command.failureThreshold ? [failed, opened('failures')] : [failed];
        return [failed, opened('probe_failed')];
      }
      case 'RecordSuccess':
        if (!successCounts(state, command.probeId)) return [];
        if (state.breaker === 'closed') return BackendFailuresCleared({ backend, cleared_failures: state.consecutiveFailures, at });
        return BreakerClosed({ backend, probe_id: command.probeId!, at });
      case 'HalfOpen':
        return state.breaker === 'open' && state.retryAt !== null && reached(at, state.retryAt) ? BreakerHalfOpened({ backend, at }) : [];
      case 'StartProbe': {
        const admission = breakerAdmission(state, at);
        if (admission.verdict === 'flow') return reject('breaker_closed', 'the breaker is closed: no probe is needed');
        if (admission.verdict === 'circuit_open') return reject('circuit_open', 'the breaker is open', { retry_at: admission.retryAt });
        if (admission.verdict === 'probe_in_flight') return reject('probe_in_flight', 'another request is probing the backend', { retry_at: admission.retryAt });
        const probe = ProbeStarted({ backend, probe_id: command.probeId, expires_at: later(at, command.probeLeaseMs), at });
        return state.breaker === 'open' ? [BreakerHalfOpened({ backend, at }), probe] : probe;
      }
      case 'PublishBootStage':
        if (state.boot?.stage === command.stage) return [];
        return BootStagePublished({ backend, stage: command.stage, at, reason: command.reason ?? null });
      default: {
        const unhandled: never = command;
        throw new Error(`unknown backend command ${JSON.stringify(unhandled)}`);
      }
    }
  },
};

/** A breaker as the backends service holds it in memory (every configured engine's stream, kept fresh from the log). */
export interface BreakerView {
  readonly modelId: string;
  readonly backend: BackendKind;
  readonly state: BackendState;
}

/**
 * The timed half-open, a workflow on the passing of time like the reaper: at a tick, every breaker
 * whose cooldown is over is half-opened on its own stream, under an id derived from the opening it
 * ends (so every gateway process may send it: the first appends, the others append nothing). Until
 * then a request that finds the cooldown over half-opens it itself (StartProbe); this makes /health
 * and backend_health say `half_open` when no request comes.
 */
export function halfOpenBreakers(tick: { readonly now: string }, breakers: readonly BreakerView[]): WorkflowCommand<Extract<BackendCommand, { type: 'HalfOpen' }>>[] {
  return breakers
    .filter(({ state }) => state.breaker === 'open' && state.retryAt !== null && reached(tick.now, state.retryAt))
    .map(({ modelId, backend, state }) => ({
      stream: backendStream(modelId, backend),
      commandId: `half-open:${backendStream(modelId, backend)}:${state.openedAt}`,
      command: { type: 'HalfOpen', backend, now: tick.now },
    }));
}
