/** The backend decider, given / when / then: every breaker transition, and boot stages published once each. */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { backendDecider, breakerAdmission, failureCounts, halfOpenBreakers, successCounts, type BackendCommand, type BackendState } from '../../deciders/backend.ts';
import {
  BackendFailed,
  BackendFailuresCleared,
  backendEvents,
  backendStream,
  backendStreamParts,
  BootStagePublished,
  BreakerClosed,
  BreakerHalfOpened,
  BreakerOpened,
  ProbeStarted,
  type BackendEvent,
} from '../../events/backend.ts';
import { decisionEvents, foldEvents } from '../../src/event-sourcing/index.ts';
import { deciderSpecification } from '../support/decider-specification.ts';

const it = suite('backend decider');
const spec = deciderSpecification(backendDecider);
const backend = 'completion' as const;
const t0 = '2026-11-26T12:00:00.000Z';
const at = (seconds: number) => new Date(Date.parse(t0) + seconds * 1000).toISOString();
const threshold = 3;
const cooldownMs = 60_000;
const leaseMs = 30_000;

const failure = (s: number, kind = 'upstream_server_error', probeId: string | null = null): BackendCommand => ({ type: 'RecordFailure', backend, kind, now: at(s), failureThreshold: threshold, cooldownMs, probeId });
const success = (s: number, probeId: string | null = null): BackendCommand => ({ type: 'RecordSuccess', backend, now: at(s), probeId });
const startProbe = (s: number, probeId: string): BackendCommand => ({ type: 'StartProbe', backend, probeId, now: at(s), probeLeaseMs: leaseMs });
const failed = (n: number, s: number, kind = 'upstream_server_error') => BackendFailed({ backend, kind, consecutive_failures: n, at: at(s) });
const opened = (n: number, s: number, reason: 'failures' | 'probe_failed' = 'failures', kind = 'upstream_server_error') =>
  BreakerOpened({ backend, reason, consecutive_failures: n, last_failure_kind: kind, failure_threshold: threshold, cooldown_ms: cooldownMs, retry_at: at(s + 60), at: at(s) });
const probing = (id: string, s: number) => ProbeStarted({ backend, probe_id: id, expires_at: at(s + 30), at: at(s) });

/** Three failures in a row at seconds 1, 2 and 3: the breaker opened at 3, half-open is due at 63. */
const openAt3 = [failed(1, 1), failed(2, 2), failed(3, 3), opened(3, 3)];

it('a success on a healthy breaker appends nothing', () => {
  spec.given([]).when(success(1)).thenNothing();
});

it('a failure while closed is counted, with its kind', () => {
  spec.given([]).when(failure(1, 'engine_oom')).then([failed(1, 1, 'engine_oom')]);
  spec.given([failed(1, 1)]).when(failure(2, 'upstream_unreachable')).thenState((s) => {
    assert.is(s.breaker, 'closed');
    assert.is(s.consecutiveFailures, 2);
    assert.is(s.lastFailureKind, 'upstream_unreachable');
    assert.is(s.lastFailureAt, at(2));
  });
});

it('the threshold-th failure in a row opens the breaker for the cooldown, recording the threshold and cooldown decided under', () => {
  spec.given([failed(1, 1), failed(2, 2)]).when(failure(3)).then([failed(3, 3), opened(3, 3)]);
  spec.given(openAt3).when(success(4)).thenState((s) => assert.is(s.breaker, 'open'));
});

it('a success between failures starts the count again (a success after failures appends once)', () => {
  spec.given([failed(1, 1), failed(2, 2)]).when(success(3)).then([BackendFailuresCleared({ backend, cleared_failures: 2, at: at(3) })]);
  spec.given([failed(1, 1), failed(2, 2), BackendFailuresCleared({ backend, cleared_failures: 2, at: at(3) })]).when(failure(4)).then([failed(1, 4)]);
});

it('while open, failures and successes of requests that started before it opened change nothing', () => {
  spec.given(openAt3).when(failure(10)).thenNothing();
  spec.given(openAt3).when(success(10)).thenNothing();
});

it('while the cooldown runs, a probe is refused with the time it ends', () => {
  spec.given(openAt3).when(startProbe(62, 'p1')).thenRejects('circuit_open', { retry_at: at(63) });
});

it('once the cooldown is over, one request half-opens the breaker and becomes its probe', () => {
  spec.given(openAt3).when(startProbe(63, 'p1')).then([BreakerHalfOpened({ backend, at: at(63) }), probing('p1', 63)]);
});

it('exactly one probe: a second request is refused while the first probes (two processes racing: the loser is decided again on this state)', () => {
  spec.given([...openAt3, BreakerHalfOpened({ backend, at: at(63) }), probing('p1', 63)]).when(startProbe(64, 'p2')).thenRejects('probe_in_flight', { retry_at: at(93) });
});

it('a probe whose process died (its lease over) is replaced by the next request', () => {
  spec.given([...openAt3, BreakerHalfOpened({ backend, at: at(63) }), probing('p1', 63)]).when(startProbe(93, 'p2')).then([probing('p2', 93)]);
});

it('the probe succeeding closes the breaker with the count at zero', () => {
  const given = [...openAt3, BreakerHalfOpened({ backend, at: at(63) }), probing('p1', 63)];
  spec.given(given).when(success(64, 'p1')).then([BreakerClosed({ backend, probe_id: 'p1', at: at(64) })]);
  spec.given(given).when(success(64, 'p1')).thenState((s) => {
    assert.is(s.breaker, 'closed');
    assert.is(s.consecutiveFailures, 0);
    assert.is(s.probe, null);
  });
});

it('the probe failing opens the breaker again for another cooldown', () => {
  spec.given([...openAt3, BreakerHalfOpened({ backend, at: at(63) }), probing('p1', 63)]).when(failure(64, 'engine_engine_dead', 'p1')).then([failed(4, 64, 'engine_engine_dead'), opened(4, 64, 'probe_failed', 'engine_engine_dead')]);
});

it('while half-open, only the probe\'s outcome counts', () => {
  const given = [...openAt3, BreakerHalfOpened({ backend, at: at(63) }), probing('p1', 63)];
  spec.given(given).when(success(64, 'other')).thenNothing();
  spec.given(given).when(failure(64, 'upstream_unreachable', null)).thenNothing();
});

it('a probe is not needed on a closed breaker', () => {
  spec.given([failed(1, 1)]).when(startProbe(2, 'p1')).thenRejects('breaker_closed');
});

it('the timed half-open: due once the cooldown is over, nothing before or twice', () => {
  spec.given(openAt3).when({ type: 'HalfOpen', backend, now: at(62) }).thenNothing();
  spec.given(openAt3).when({ type: 'HalfOpen', backend, now: at(63) }).then([BreakerHalfOpened({ backend, at: at(63) })]);
  spec.given([...openAt3, BreakerHalfOpened({ backend, at: at(63) })]).when({ type: 'HalfOpen', backend, now: at(64) }).thenNothing();
  spec.given([]).when({ type: 'HalfOpen', backend, now: at(64) }).thenNothing();
});

it('after the timed half-open, the next request is the probe', () => {
  spec.given([...openAt3, BreakerHalfOpened({ backend, at: at(63) })]).when(startProbe(70, 'p1')).then([probing('p1', 70)]);
});

it('the timed half-open workflow sends HalfOpen to each breaker past its cooldown, under an id derived from the opening', () => {
  const state = (events: Parameters<typeof foldEvents>[2]): BackendState => foldEvents(backendDecider, backendDecider.initialState(), events as never);
  const breakers = [
    { modelId: 'a', backend, state: state(openAt3) },
    { modelId: 'b', backend: 'activation' as const, state: state(openAt3) },
    { modelId: 'c', backend, state: state([failed(1, 1)]) },
  ];
  assert.equal(halfOpenBreakers({ now: at(62) }, breakers), []);
  assert.equal(halfOpenBreakers({ now: at(63) }, breakers), [
    { stream: 'backend-a', commandId: `half-open:backend-a:${at(3)}`, command: { type: 'HalfOpen', backend: 'completion', now: at(63) } },
    { stream: 'backend-b:activation', commandId: `half-open:backend-b:activation:${at(3)}`, command: { type: 'HalfOpen', backend: 'activation', now: at(63) } },
  ]);
});

it('a boot stage is published when it differs from the last one, once', () => {
  const stage = (stage: 'weights_loading' | 'serving', s: number) => BootStagePublished({ backend, stage, at: at(s), reason: null });
  spec.given([]).when({ type: 'PublishBootStage', backend, stage: 'weights_loading', now: at(1) }).then([stage('weights_loading', 1)]);
  spec.given([stage('weights_loading', 1)]).when({ type: 'PublishBootStage', backend, stage: 'weights_loading', now: at(2) }).thenNothing();
  spec.given([stage('weights_loading', 1)]).when({ type: 'PublishBootStage', backend, stage: 'serving', now: at(3) }).then([stage('serving', 3)]);
  spec.given([]).when({ type: 'PublishBootStage', backend, stage: 'failed', now: at(1), reason: 'exited with code 1' }).then([BootStagePublished({ backend, stage: 'failed', at: at(1), reason: 'exited with code 1' })]);
});

it('boot stages and the breaker are independent', () => {
  spec.given([...openAt3, BootStagePublished({ backend, stage: 'serving', at: at(4) })]).when(startProbe(63, 'p1')).thenState((s) => {
    assert.is(s.breaker, 'half_open');
    assert.equal(s.boot, { stage: 'serving', at: at(4), reason: null });
  });
});

it('stream ids: the completion engine on backend-<model>, a separate activation engine beside it', () => {
  assert.is(backendStream('ref-byte'), 'backend-ref-byte');
  assert.is(backendStream('ref-byte', 'activation'), 'backend-ref-byte:activation');
  assert.equal(backendStreamParts('backend-ref-byte'), { modelId: 'ref-byte', backend: 'completion' });
  assert.equal(backendStreamParts('backend-ref-byte:activation'), { modelId: 'ref-byte', backend: 'activation' });
  assert.is(backendStreamParts('meter-x-2026-11-26'), null);
  assert.ok(backendEvents.has('BootStagePublished'));
});

// The rules the backends service asks on its hot path are the decider's own: given the same events,
// each says what the decider would do with the command it stands for.
const stateOf = (events: readonly BackendEvent[]) => foldEvents(backendDecider, backendDecider.initialState(), events);

it('breaker admission: closed flows; open refuses until the cooldown, then one may probe; half-open refuses while a probe holds its lease', () => {
  assert.equal(breakerAdmission(stateOf([]), at(1)), { verdict: 'flow' });
  assert.equal(breakerAdmission(stateOf(openAt3), at(62)), { verdict: 'circuit_open', retryAt: at(63) });
  assert.equal(breakerAdmission(stateOf(openAt3), at(63)), { verdict: 'probe' });
  const probingAt63 = [...openAt3, BreakerHalfOpened({ backend, at: at(63) }), probing('p', 63)];
  assert.equal(breakerAdmission(stateOf(probingAt63), at(92)), { verdict: 'probe_in_flight', retryAt: at(93) });
  assert.equal(breakerAdmission(stateOf(probingAt63), at(93)), { verdict: 'probe' }, 'the probe\'s lease ran out');
  assert.equal(breakerAdmission(stateOf([...openAt3, BreakerHalfOpened({ backend, at: at(63) })]), at(64)), { verdict: 'probe' });
  // and StartProbe is decided by the same rule
  spec.given(openAt3).when(startProbe(62, 'p')).thenRejects('circuit_open');
  spec.given(probingAt63).when(startProbe(92, 'q')).thenRejects('probe_in_flight');
  spec.given(probingAt63).when(startProbe(93, 'q')).then([probing('q', 93)]);
});

it('what counts: every failure while closed, a success only after failures; open or half-open, only the probe\'s outcome', () => {
  const probingAt63 = [...openAt3, BreakerHalfOpened({ backend, at: at(63) }), probing('p', 63)];
  for (const [events, probeId, failure, success] of [
    [[], null, true, false],
    [[failed(1, 1)], null, true, true],
    [openAt3, null, false, false],
    [probingAt63, null, false, false],
    [probingAt63, 'other', false, false],
    [probingAt63, 'p', true, true],
  ] as const) {
    const state = stateOf([...events]);
    assert.is(failureCounts(state, probeId), failure, `failure, ${events.length} events, probe ${probeId}`);
    assert.is(successCounts(state, probeId), success, `success, ${events.length} events, probe ${probeId}`);
    // the decider appends exactly when the rule says the outcome counts
    const appended = (command: BackendCommand) => (decisionEvents(backendDecider.decide(command, state)) as readonly unknown[]).length > 0;
    assert.is(appended({ type: 'RecordFailure', backend, kind: 'timeout', now: at(70), failureThreshold: threshold, cooldownMs, probeId }), failure);
    assert.is(appended({ type: 'RecordSuccess', backend, now: at(70), probeId }), success);
  }
});

it.run();
