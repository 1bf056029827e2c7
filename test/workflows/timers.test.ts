/**
 * Workflows with timers, given / when / then: a decision schedules an input for later; a tick before
 * its time fires nothing, a tick at its time fires it once, a second tick does not fire it again. Then
 * each timer that was a loop in a service, as the workflow it now is: the breakers' half-open (one
 * timer per opening), and the periodic ones (the hold reaper, the spend watcher, the harvest resumer,
 * the harvest files' retention), seeded once and each tick scheduling the next.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { scheduleInput, workflowStream, type WorkflowInput } from '../../src/event-sourcing/index.ts';
import { BreakerClosed, BreakerOpened, backendStream } from '../../events/backend.ts';
import {
  breakerHalfOpenWorkflow,
  HalfOpenDue,
  harvestResumerWorkflow,
  harvestRetentionWorkflow,
  holdReaperWorkflow,
  nextTickAt,
  PeriodicTick,
  spendWatcherWorkflow,
  type BreakerInput,
} from '../../workflows/index.ts';
import { workflowSpecification } from '../support/workflow-specification.ts';

const it = suite('workflows with timers');
const stream = backendStream('ref-byte');
const T0 = '2026-11-26T12:00:00.000Z';
const plus = (iso: string, ms: number) => new Date(Date.parse(iso) + ms).toISOString();
const opened = (at: string, retryAt: string) =>
  ({
    ...BreakerOpened({ backend: 'completion', reason: 'failures', consecutive_failures: 5, last_failure_kind: 'timeout', failure_threshold: 5, cooldown_ms: 30_000, retry_at: retryAt, at }),
    id: `opened-${at}`,
    streamId: stream,
  }) as WorkflowInput<BreakerInput>;
const halfOpen = (at: string, openedAt: string) => ({ stream, commandId: `half-open:${stream}:${openedAt}`, command: { type: 'HalfOpen' as const, backend: 'completion' as const, now: at } });

const breakers = workflowSpecification(breakerHalfOpenWorkflow);
const retryAt = plus(T0, 30_000);
const timerId = `half-open:${stream}:${T0}`;

it('a decision schedules an input for later: an opened breaker schedules its half-open at the end of its cooldown, on its own instance', () => {
  const when = breakers.given().when(opened(T0, retryAt));
  when.then([scheduleInput(retryAt, timerId, HalfOpenDue({ backend_stream: stream, opened_at: T0 }))]);
  assert.is(when.instance(), stream);
});

it('a tick before the time fires nothing; a tick at the time fires it once, and what it decides is the rule’s; a second tick fires nothing again', () => {
  const given = breakers.given([opened(T0, retryAt)]);
  given.whenTick(plus(retryAt, -1)).thenNothing();
  const atTime = given.whenTick(retryAt);
  atTime.thenFired([timerId]);
  atTime.then([halfOpen(retryAt, T0)]);
  assert.equal(atTime.pending(), []);
  atTime.andThen().whenTick(plus(retryAt, 60_000)).thenNothing();
});

it('a timer due while nobody ticked fires at the next tick, at that tick’s time', () => {
  breakers.given([opened(T0, retryAt)]).whenTick(plus(retryAt, 3_600_000)).then([halfOpen(plus(retryAt, 3_600_000), T0)]);
});

it('a breaker closed before its cooldown ended (a request probed it) is not half-opened when the timer fires', () => {
  const closed = { ...BreakerClosed({ backend: 'completion', probe_id: 'p1', at: plus(T0, 1_000) }), id: 'closed', streamId: stream } as WorkflowInput<BreakerInput>;
  const tick = breakers.given([opened(T0, retryAt), closed]).whenTick(retryAt);
  tick.thenFired([timerId]);
  tick.then([]);
});

it('a breaker opened again schedules a second timer, its id the second opening’s', () => {
  const reopenedAt = plus(retryAt, 5_000);
  const tick = breakers.given([opened(T0, retryAt), opened(reopenedAt, plus(reopenedAt, 30_000))]).whenTick(plus(reopenedAt, 30_000));
  tick.thenFired([timerId, `half-open:${stream}:${reopenedAt}`]);
  // The first fires on the state as it is now (open until the second cooldown's end): the rule judges it due, under the second opening's id.
  tick.then([halfOpen(plus(reopenedAt, 30_000), reopenedAt), halfOpen(plus(reopenedAt, 30_000), reopenedAt)]);
});

// --- periodic workflows ---------------------------------------------------------------------------

const periodMs = 15_000;
const tick = (at: string) => scheduleInput(at, `tick:${at}`, PeriodicTick({ at }));
const hold = (requestId: string, expiresAt: string) => ({ requestId, streamId: 'meter-k-2026-11-26', expiresAt: new Date(expiresAt) });

it('a periodic workflow is seeded with a tick one period on; each tick decides its rule and schedules the next, one period on', () => {
  const reaper = workflowSpecification(holdReaperWorkflow({ periodMs, leaseTtlMs: 60_000, read: async () => ({ expired: [], runningHere: new Set() }) }));
  const view = { expired: [hold('a', '2026-11-26T11:59:00Z')], runningHere: new Set<string>() };
  const first = reaper.given([], { seededAt: plus(T0, -periodMs) }).whenTick(T0, view);
  first.thenFired([`tick:${T0}`]);
  first.then([{ stream: 'meter-k-2026-11-26', commandId: 'expire:a', command: { type: 'Expire', requestId: 'a', now: T0 } }, tick(plus(T0, periodMs))]);
  first.andThen().whenTick(plus(T0, periodMs - 1), view).thenNothing();
  const second = first.andThen().whenTick(plus(T0, periodMs), { expired: [], runningHere: new Set() });
  second.thenFired([`tick:${plus(T0, periodMs)}`]);
  second.then([tick(plus(T0, 2 * periodMs))]);
});

it('a tick given late (no process held the lease) fires once, and the next is on the grid after it, not every tick it missed', () => {
  const late = plus(T0, 3_600_000 + 4_000);
  const watcher = workflowSpecification(spendWatcherWorkflow({ periodMs, read: async () => ({ spendMicros: 0, capMicros: null, reachedDay: null }) }));
  const round = watcher.given([], { seededAt: plus(T0, -periodMs) }).whenTick(late, { spendMicros: 0, capMicros: null, reachedDay: null });
  round.thenFired([`tick:${T0}`]);
  round.then([tick(plus(T0, 3_600_000 + periodMs))]);
  assert.is(nextTickAt(T0, T0, periodMs), plus(T0, periodMs));
  assert.is(nextTickAt(T0, plus(T0, periodMs), periodMs), plus(T0, 2 * periodMs), 'fired exactly at the next slot: the one after');
});

it("the spend watcher's tick reports the day's spend to its spend stream", () => {
  const view = { spendMicros: 12_500_000, capMicros: 100_000_000, reachedDay: null };
  const watcher = workflowSpecification(spendWatcherWorkflow({ periodMs, read: async () => view }));
  watcher
    .given([], { seededAt: plus(T0, -periodMs) })
    .whenTick(T0, view)
    .then([
      { stream: 'spend-2026-11-26', commandId: 'spend-check:2026-11-26:12500000', command: { type: 'CheckSpend', day: '2026-11-26', spendMicros: 12_500_000, capMicros: 100_000_000, now: T0 } },
      tick(plus(T0, periodMs)),
    ]);
});

it("the harvest resumer's tick redispatches a job whose claim lapsed", () => {
  const view = {
    jobs: [{ jobId: 'j1', status: 'running', leaseUntil: new Date(plus(T0, -1)), startedAt: new Date(plus(T0, -60_000)), submittedAt: new Date(plus(T0, -60_000)), redispatches: 0 }],
    leaseMs: 30_000,
    maxRedispatches: 3,
  };
  const resumer = workflowSpecification(harvestResumerWorkflow({ periodMs: 5_000, read: async () => view }));
  resumer
    .given([], { seededAt: plus(T0, -5_000) })
    .whenTick(T0, view)
    .then([
      {
        stream: 'harvest-j1',
        commandId: 'redispatch:j1:1',
        command: { type: 'Redispatch', now: T0, leaseMs: 30_000, maxRedispatches: 3, reason: `the claim's lease lapsed at ${plus(T0, -1)}` },
      },
      scheduleInput(plus(T0, 5_000), `tick:${plus(T0, 5_000)}`, PeriodicTick({ at: plus(T0, 5_000) })),
    ]);
});

it("the harvest retention's tick removes the files of each ended job past the retention", () => {
  const retention = workflowSpecification(harvestRetentionWorkflow({ periodMs: 60_000, read: async () => ({ expired: ['j9'] }) }));
  retention
    .given([], { seededAt: plus(T0, -60_000) })
    .whenTick(T0, { expired: ['j9'] })
    .then([
      { stream: 'harvest-j9', commandId: 'remove-files:j9', command: { type: 'RemoveFiles', reason: 'retention', byKeyPrefix: null, now: T0 } },
      scheduleInput(plus(T0, 60_000), `tick:${plus(T0, 60_000)}`, PeriodicTick({ at: plus(T0, 60_000) })),
    ]);
});

it('ticks are kept on one stream per hour', () => {
  const reaper = holdReaperWorkflow({ periodMs, leaseTtlMs: 60_000, read: async () => ({ expired: [], runningHere: new Set() }) });
  const input = { ...PeriodicTick({ at: T0 }), id: `tick:${T0}`, streamId: '' } as WorkflowInput<ReturnType<typeof PeriodicTick>>;
  assert.is(workflowStream(reaper.name, reaper.instanceOf(input)), 'workflow-hold-reaper-2026-11-26T12');
});

it.run();
