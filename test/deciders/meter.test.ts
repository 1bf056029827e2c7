/**
 * The meter decider's rules, given / when / then: reserve (budgets, clamp, rate, active cap), settle,
 * expire, renew, carried holds, and the UTC month and day boundaries. No token over budget, ever.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { balanceFrom, heldTokens, meterDecider, queuedRequests, type MeterCommand, type MeterState } from '../../deciders/meter.ts';
import type { KeyBudgetValues } from '../../events/key.ts';
import {
  BudgetReserved,
  CarriedHoldEnded,
  CarriedHoldReleased,
  LateUsageRecorded,
  MeterClosed,
  MeterOpened,
  meterEvents,
  meterStream,
  QueueEntriesRenewed,
  QueueLeft,
  RequestQueued,
  RequestRejected,
  ReservationExpired,
  ReservationRenewed,
  SlotLeaseRenewed,
  SlotsLeased,
  UsageSettled,
  utcDay,
  type MeterEvent,
  type MeterOpening,
  type RequestFactsData,
} from '../../events/meter.ts';
import { decisionEvents, foldEvents, isRejection } from '../../src/event-sourcing/index.ts';
import { deciderSpecification } from '../support/decider-specification.ts';

const spec = deciderSpecification(meterDecider);
const key_id = '0123456789ab';
const day = '2026-11-24';
const at = (time: string, d = day) => `${d}T${time}Z`;
const ms = (instant: string) => Date.parse(instant);
const iso = (epochMs: number) => new Date(epochMs).toISOString();
const noon = at('12:00:00.000');
const ttlMs = 600_000;
const limits = { maxActive: 16, perMinute: 600 };

const unlimited: KeyBudgetValues = { monthly_token_budget: null, daily_token_budget: null, monthly_input_token_budget: null, monthly_output_token_budget: null, monthly_harvest_jobs: null };

const opening = (o: Partial<MeterOpening> = {}): MeterOpening => ({
  key_id,
  day,
  month_input_tokens: 0,
  month_output_tokens: 0,
  carried_from: '2026-11-23',
  carried_holds: [],
  carried_leases: [],
  recent_starts: [],
  carried_queue: [],
  ...o,
});
const opened = (o: Partial<MeterOpening> = {}, when = at('00:00:00.000', o.day ?? day)) => MeterOpened({ ...opening(o), carried_queue: o.carried_queue ?? [], at: when });

const facts = (request_id: string): RequestFactsData => ({
  request_id,
  key_prefix: key_id,
  email: 'ada@example.com',
  client_ip: '203.0.113.7',
  endpoint: '/v1/completions',
  model: 'base-7b',
  user: 'tag-1',
  workload: 'batch',
});

type Reserve = Extract<MeterCommand, { type: 'Reserve' }>;
const reserve = (o: Partial<Omit<Reserve, 'type'>> & { id?: string; budget?: Partial<KeyBudgetValues> } = {}): Reserve => {
  const { id = 'r1', budget = {}, ...rest } = o;
  return {
    type: 'Reserve',
    facts: facts(id),
    inputTokens: 10,
    maxTokens: 100,
    maxTokensRequested: 100,
    choices: 1,
    budgets: { ...unlimited, ...budget },
    keyStatus: 'active',
    limits,
    ttlMs,
    now: noon,
    ...rest,
  };
};

/** The event a Reserve of these figures appends. */
const reserved = (
  o: {
    id?: string;
    input?: number;
    applied?: number;
    requested?: number | null;
    choices?: number;
    clampedBy?: string | null;
    now?: string;
    ttl?: number;
    holder?: string | null;
    budget?: Partial<KeyBudgetValues>;
  } = {},
) => {
  const { id = 'r1', input = 10, applied = 100, requested = 100, choices = 1, clampedBy = null, now = noon, ttl = ttlMs, holder = null, budget = {} } = o;
  const { monthly_harvest_jobs: _jobs, ...budgets } = { ...unlimited, ...budget };
  return BudgetReserved({
    ...facts(id),
    input_tokens: input,
    output_tokens: applied * choices,
    max_tokens_requested: requested,
    max_tokens_applied: applied,
    choices,
    clamped_by: clampedBy,
    at: now,
    expires_at: iso(ms(now) + ttl),
    lease_holder: holder,
    budgets,
    limits: { max_active: limits.maxActive, per_minute: limits.perMinute, max_queued: null },
  });
};

type Settle = Extract<MeterCommand, { type: 'Settle' }>;
const settle = (id: string, input: number, output: number, now = at('12:00:30.000')): Settle => ({
  type: 'Settle',
  facts: facts(id),
  inputTokens: input,
  outputTokens: output,
  status: 200,
  latencyMs: 30_000,
  gpuSeconds: 1.5,
  costMicros: 3000,
  pricePerGpuSecondMicros: 2000,
  basis: 'engine_usage',
  disconnected: false,
  now,
});
const settled = (id: string, input: number, output: number, now = at('12:00:30.000')) =>
  UsageSettled({ ...facts(id), input_tokens: input, output_tokens: output, status: 200, latency_ms: 30_000, gpu_seconds: 1.5, disconnected: false, at: now, cost_micros: 3000, price_per_gpu_second_micros: 2000, basis: 'engine_usage', generated_output_tokens: null, relayed_output_tokens: null });

/** A hold made earlier today and settled with this many tokens: today's (and the month's) usage. */
const usedToday = (id: string, input: number, output: number): MeterEvent[] => [
  reserved({ id, input, applied: output, requested: output, now: at('08:00:00.000') }),
  settled(id, input, output, at('08:00:10.000')),
];

/** One open reservation: 10 prompt tokens, 100 output. */
const r1 = reserved({ id: 'r1', input: 10, applied: 100 });

// ---------------------------------------------------------------------------------------------

const opening_ = suite('meter decider: opening a day');
opening_('the stream is meter-<keyId>-<yyyy-mm-dd>', () => {
  assert.is(meterStream(key_id, day), 'meter-0123456789ab-2026-11-24');
});
opening_('a meter day opens once; opening it again appends nothing', () => {
  spec.given([]).when({ type: 'OpenMeter', opening: opening(), now: at('00:00:00.000') }).then([opened()]);
  spec.given([opened()]).when({ type: 'OpenMeter', opening: opening({ month_input_tokens: 5 }), now: at('00:00:01.000') }).thenNothing();
});
opening_('a reservation needs an opened meter', () => {
  spec.given([]).when(reserve()).thenRejects('meter_not_opened');
});
opening_('a paused or revoked key is key_inactive at the reservation re-check', () => {
  spec.given([opened()]).when(reserve({ keyStatus: 'paused' })).thenRejects('key_inactive', { status: 'paused' });
  spec.given([opened()]).when(reserve({ keyStatus: 'revoked' })).thenRejects('key_inactive', { status: 'revoked' });
});
opening_('an active key with no budget reserves prompt + max_tokens × choices, unclamped', () => {
  spec.given([opened()]).when(reserve()).then([reserved()]);
  spec.given([opened()]).when(reserve({ maxTokens: 1_000_000, maxTokensRequested: null, choices: 16 })).then([reserved({ applied: 1_000_000, requested: null, choices: 16 })]);
  spec.given([opened({ month_input_tokens: 9e12, month_output_tokens: 9e12 })]).when(reserve()).then([reserved()]);
});
opening_('the hold expires ttl after the reservation', () => {
  spec.given([opened()]).when(reserve({ ttlMs: 90_000 })).then([reserved({ ttl: 90_000 })]);
});
opening_.run();

// ---------------------------------------------------------------------------------------------

const budgets = suite('meter decider: budgets at their boundaries');

budgets('monthly total: the month-to-date plus prompt plus max_tokens exactly at the budget fits unclamped', () => {
  // 900 used + 10 prompt + 90 output = 1000.
  const given = [opened({ month_input_tokens: 400, month_output_tokens: 500 })];
  spec.given(given).when(reserve({ maxTokens: 90, maxTokensRequested: 90, budget: { monthly_token_budget: 1000 } })).then([reserved({ budget: { monthly_token_budget: 1000 },  applied: 90, requested: 90 })]);
});
budgets('monthly total: one token over is clamped to fit, naming the budget', () => {
  const given = [opened({ month_input_tokens: 400, month_output_tokens: 500 })];
  spec.given(given).when(reserve({ maxTokens: 91, maxTokensRequested: 91, budget: { monthly_token_budget: 1000 } })).then([reserved({ budget: { monthly_token_budget: 1000 },  applied: 90, requested: 91, clampedBy: 'monthly_token_budget' })]);
});
budgets('monthly total: with several choices the room is divided, rounding down', () => {
  // Room 90 for 4 choices: 22 each (88 held), never 23 (92 > 90).
  const given = [opened({ month_input_tokens: 400, month_output_tokens: 500 })];
  spec
    .given(given)
    .when(reserve({ maxTokens: 100, choices: 4, budget: { monthly_token_budget: 1000 } }))
    .then([reserved({ budget: { monthly_token_budget: 1000 }, applied: 22, choices: 4, clampedBy: 'monthly_token_budget' })]);
  // Exactly one token per choice fits.
  spec.given([opened({ month_input_tokens: 986 })]).when(reserve({ choices: 4, budget: { monthly_token_budget: 1000 } })).then([reserved({ budget: { monthly_token_budget: 1000 },  applied: 1, choices: 4, clampedBy: 'monthly_token_budget' })]);
});
budgets('monthly total: when not even one token per choice fits, budget_exceeded names it', () => {
  spec.given([opened({ month_input_tokens: 990 })]).when(reserve({ budget: { monthly_token_budget: 1000 } })).thenRejects('budget_exceeded', { budget: 'monthly_token_budget' });
  spec.given([opened({ month_input_tokens: 987 })]).when(reserve({ choices: 4, budget: { monthly_token_budget: 1000 } })).thenRejects('budget_exceeded', { budget: 'monthly_token_budget' });
  spec.given([opened({ month_output_tokens: 1000 })]).when(reserve({ inputTokens: 0, budget: { monthly_token_budget: 1000 } })).thenRejects('budget_exceeded', { budget: 'monthly_token_budget' });
  spec.given([opened()]).when(reserve({ inputTokens: 0, budget: { monthly_token_budget: 0 } })).thenRejects('budget_exceeded', { budget: 'monthly_token_budget' });
  // One token left fits a one-token answer.
  spec.given([opened({ month_input_tokens: 989 })]).when(reserve({ budget: { monthly_token_budget: 1000 } })).then([reserved({ budget: { monthly_token_budget: 1000 },  applied: 1, clampedBy: 'monthly_token_budget' })]);
});
budgets('monthly total: usage beyond the budget (a lowered budget) rejects, it never goes negative-positive', () => {
  spec.given([opened({ month_input_tokens: 5000 })]).when(reserve({ budget: { monthly_token_budget: 1000 } })).thenRejects('budget_exceeded', { budget: 'monthly_token_budget' });
});

budgets('daily: only this UTC day counts, not the month-to-date it opened with', () => {
  // 60 used today, 10 prompt, 30 output = 100; the 9000 of earlier days do not count against the day.
  const given = [opened({ month_input_tokens: 9000 }), ...usedToday('earlier', 20, 40)];
  spec.given(given).when(reserve({ maxTokens: 30, maxTokensRequested: 30, budget: { daily_token_budget: 100 } })).then([reserved({ budget: { daily_token_budget: 100 },  applied: 30, requested: 30 })]);
  spec.given(given).when(reserve({ maxTokens: 31, maxTokensRequested: 31, budget: { daily_token_budget: 100 } })).then([reserved({ budget: { daily_token_budget: 100 },  applied: 30, requested: 31, clampedBy: 'daily_token_budget' })]);
  spec.given(given).when(reserve({ maxTokens: 31, choices: 7, budget: { daily_token_budget: 100 } })).then([reserved({ budget: { daily_token_budget: 100 },  applied: 4, requested: 100, choices: 7, clampedBy: 'daily_token_budget' })]);
  spec.given(given).when(reserve({ inputTokens: 40, budget: { daily_token_budget: 100 } })).thenRejects('budget_exceeded', { budget: 'daily_token_budget' });
  spec.given(given).when(reserve({ inputTokens: 36, choices: 5, budget: { daily_token_budget: 100 } })).thenRejects('budget_exceeded', { budget: 'daily_token_budget' });
});

budgets('monthly input: all or nothing, lowering max_tokens cannot help', () => {
  const given = [opened({ month_input_tokens: 90, month_output_tokens: 5000 })];
  spec.given(given).when(reserve({ inputTokens: 10, maxTokens: 1000, maxTokensRequested: 1000, budget: { monthly_input_token_budget: 100 } })).then([reserved({ budget: { monthly_input_token_budget: 100 },  input: 10, applied: 1000, requested: 1000 })]);
  spec.given(given).when(reserve({ inputTokens: 11, budget: { monthly_input_token_budget: 100 } })).thenRejects('budget_exceeded', { budget: 'monthly_input_token_budget' });
  spec.given([opened()]).when(reserve({ inputTokens: 1, budget: { monthly_input_token_budget: 0 } })).thenRejects('budget_exceeded', { budget: 'monthly_input_token_budget' });
  // A prompt of 0 tokens fits a spent input budget exactly.
  spec.given([opened({ month_input_tokens: 100 })]).when(reserve({ inputTokens: 0, budget: { monthly_input_token_budget: 100 } })).then([reserved({ budget: { monthly_input_token_budget: 100 },  input: 0 })]);
});

budgets('monthly output: max_tokens × choices at the boundary; the prompt does not count', () => {
  const given = [opened({ month_input_tokens: 5000, month_output_tokens: 90 })];
  spec.given(given).when(reserve({ inputTokens: 500, maxTokens: 10, maxTokensRequested: 10, budget: { monthly_output_token_budget: 100 } })).then([reserved({ budget: { monthly_output_token_budget: 100 },  input: 500, applied: 10, requested: 10 })]);
  spec.given(given).when(reserve({ inputTokens: 500, maxTokens: 11, maxTokensRequested: 11, budget: { monthly_output_token_budget: 100 } })).then([reserved({ budget: { monthly_output_token_budget: 100 },  input: 500, applied: 10, requested: 11, clampedBy: 'monthly_output_token_budget' })]);
  spec.given(given).when(reserve({ maxTokens: 11, choices: 3, budget: { monthly_output_token_budget: 100 } })).then([reserved({ budget: { monthly_output_token_budget: 100 },  applied: 3, requested: 100, choices: 3, clampedBy: 'monthly_output_token_budget' })]);
  spec.given(given).when(reserve({ choices: 11, budget: { monthly_output_token_budget: 100 } })).thenRejects('budget_exceeded', { budget: 'monthly_output_token_budget' });
  spec.given([opened({ month_output_tokens: 100 })]).when(reserve({ budget: { monthly_output_token_budget: 100 } })).thenRejects('budget_exceeded', { budget: 'monthly_output_token_budget' });
});

budgets('several budgets: the tightest one clamps and is named', () => {
  const given = [opened({ month_input_tokens: 100 }), ...usedToday('earlier', 10, 10)];
  // Month room: 1000 - 120 - 10 = 870; day room: 100 - 20 - 10 = 70; output room: 50.
  const all = { monthly_token_budget: 1000, daily_token_budget: 100, monthly_output_token_budget: 60 };
  spec.given(given).when(reserve({ budget: all })).then([reserved({ budget: all, applied: 50, clampedBy: 'monthly_output_token_budget' })]);
  spec.given(given).when(reserve({ budget: { ...all, monthly_output_token_budget: null } })).then([reserved({ budget: { ...all, monthly_output_token_budget: null },  applied: 70, clampedBy: 'daily_token_budget' })]);
  spec.given(given).when(reserve({ maxTokens: 40, maxTokensRequested: 40, budget: all })).then([reserved({ budget: all, applied: 40, requested: 40 })]);
});

budgets('open holds count against every budget: two reservations in a row', () => {
  const budget = { monthly_token_budget: 100 };
  const first = reserved({ id: 'r1', input: 10, applied: 40, requested: 40, budget });
  spec.given([opened()]).when(reserve({ id: 'r1', maxTokens: 40, maxTokensRequested: 40, budget })).then([first]);
  // 50 held: the second has room for 100 - 50 - 10 = 40.
  spec.given([opened(), first]).when(reserve({ id: 'r2', maxTokens: 50, maxTokensRequested: 50, budget })).then([reserved({ id: 'r2', applied: 40, requested: 50, clampedBy: 'monthly_token_budget', budget })]);
  spec.given([opened(), first, reserved({ id: 'r2', applied: 40 })]).when(reserve({ id: 'r3', budget })).thenRejects('budget_exceeded', { budget: 'monthly_token_budget' });
  // Holds count against the day, the input and the output budgets too.
  spec.given([opened(), first]).when(reserve({ id: 'r2', budget: { daily_token_budget: 60 } })).thenRejects('budget_exceeded', { budget: 'daily_token_budget' });
  spec.given([opened(), first]).when(reserve({ id: 'r2', inputTokens: 11, budget: { monthly_input_token_budget: 20 } })).thenRejects('budget_exceeded', { budget: 'monthly_input_token_budget' });
  spec.given([opened(), first]).when(reserve({ id: 'r2', budget: { monthly_output_token_budget: 41 } })).then([reserved({ budget: { monthly_output_token_budget: 41 },  id: 'r2', applied: 1, clampedBy: 'monthly_output_token_budget' })]);
});

budgets('a settlement replaces the hold with the real usage, freeing the rest', () => {
  const budget = { monthly_token_budget: 100 };
  const given = [opened(), reserved({ id: 'r1', input: 10, applied: 80 }), settled('r1', 10, 20)];
  // 30 charged, nothing held: 100 - 30 - 10 = 60.
  spec.given(given).when(reserve({ id: 'r2', budget })).then([reserved({ id: 'r2', applied: 60, clampedBy: 'monthly_token_budget', budget })]);
});

const carriedHold = { request_id: 'late', day: '2026-11-23', input_tokens: 10, output_tokens: 40, at: at('23:59:59.900', '2026-11-23'), expires_at: at('00:09:59.900'), lease_holder: null };
budgets('holds carried over midnight count against the month but not against the day', () => {
  const given = [opened({ carried_holds: [carriedHold] })];
  spec.given(given).when(reserve({ budget: { monthly_token_budget: 100 } })).then([reserved({ budget: { monthly_token_budget: 100 },  applied: 40, clampedBy: 'monthly_token_budget' })]);
  spec.given(given).when(reserve({ budget: { daily_token_budget: 100 } })).then([reserved({ budget: { daily_token_budget: 100 },  applied: 90, clampedBy: 'daily_token_budget' })]);
  spec.given(given).when(reserve({ inputTokens: 91, budget: { monthly_input_token_budget: 100 } })).thenRejects('budget_exceeded', { budget: 'monthly_input_token_budget' });
  spec.given(given).when(reserve({ budget: { monthly_output_token_budget: 100 } })).then([reserved({ budget: { monthly_output_token_budget: 100 },  applied: 60, clampedBy: 'monthly_output_token_budget' })]);
});
budgets('Retry-After of budget_exceeded: 1 s while a hold on that budget is open, else the seconds until its period turns', () => {
  // Noon, 2026-11-24: the day turns in 12 h, the month on 2026-12-01 (6.5 days).
  const toMidnight = 12 * 3600;
  const toMonth = toMidnight + 6 * 86_400;
  spec.given([opened({ month_input_tokens: 995 })]).when(reserve({ budget: { monthly_token_budget: 1000 } })).thenRejects('budget_exceeded', { budget: 'monthly_token_budget', retry_after_seconds: toMonth });
  spec.given([opened(), ...usedToday('earlier', 40, 55)]).when(reserve({ id: 'r2', budget: { daily_token_budget: 100 } })).thenRejects('budget_exceeded', { budget: 'daily_token_budget', retry_after_seconds: toMidnight });
  spec.given([opened({ month_output_tokens: 50 })]).when(reserve({ budget: { monthly_output_token_budget: 50 } })).thenRejects('budget_exceeded', { retry_after_seconds: toMonth });
  spec.given([opened({ month_input_tokens: 95 })]).when(reserve({ budget: { monthly_input_token_budget: 100 } })).thenRejects('budget_exceeded', { retry_after_seconds: toMonth });
  // An open hold may settle for less than it holds: worth trying again soon.
  spec.given([opened(), r1]).when(reserve({ id: 'r2', budget: { monthly_token_budget: 115 } })).thenRejects('budget_exceeded', { budget: 'monthly_token_budget', retry_after_seconds: 1 });
  spec.given([opened(), r1]).when(reserve({ id: 'r2', budget: { daily_token_budget: 115 } })).thenRejects('budget_exceeded', { retry_after_seconds: 1 });
  spec.given([opened(), r1]).when(reserve({ id: 'r2', budget: { monthly_output_token_budget: 100 } })).thenRejects('budget_exceeded', { retry_after_seconds: 1 });
  // A hold carried from yesterday holds against the month, not the day.
  spec.given([opened({ carried_holds: [carriedHold] }), ...usedToday('earlier', 40, 55)]).when(reserve({ id: 'r2', budget: { daily_token_budget: 100 } })).thenRejects('budget_exceeded', { retry_after_seconds: toMidnight });
  // One second before a month's last midnight: both turn then.
  const lastSecond = '2026-11-30T23:59:59.000Z';
  spec.given([opened({ day: '2026-11-30', month_input_tokens: 995 }, '2026-11-30T00:00:00.000Z')]).when(reserve({ now: lastSecond, budget: { monthly_token_budget: 1000 } })).thenRejects('budget_exceeded', { retry_after_seconds: 1 });
});
budgets.run();

// ---------------------------------------------------------------------------------------------

const rate = suite('meter decider: 600 starts per rolling minute');
/** `count` starts spread evenly from `first` to `last` (epoch ms). */
const spread = (count: number, first: number, last: number) => Array.from({ length: count }, (_, i) => (count === 1 ? first : Math.round(first + ((last - first) * i) / (count - 1))));
const t = ms(noon);

rate('the 600th start in a minute passes, the 601st is rate_limited', () => {
  const starts599 = spread(599, t - 50_000, t - 1);
  spec.given([opened({ recent_starts: starts599 })]).when(reserve()).then([reserved()]);
  const starts600 = [...starts599, t - 1];
  // The oldest leaves the window 50 s after it started: 10 s from now.
  spec.given([opened({ recent_starts: starts600 })]).when(reserve()).thenRejects('rate_limited', { retry_after_seconds: 10 });
});
rate('starts recorded by reservations on this stream count, settled or not', () => {
  const given: MeterEvent[] = [opened({ recent_starts: spread(598, t - 40_000, t - 20_000) }), reserved({ id: 'a', now: iso(t - 10_000) }), settled('a', 10, 5, iso(t - 9_000))];
  // 599 starts: the 600th passes and is itself recorded.
  spec.given(given).when(reserve()).then([reserved()]);
  spec.given(given).when(reserve()).thenState((state) => assert.is(state.starts.size, 600));
  spec.given([...given, reserved({ id: 'b', now: iso(t - 5_000) })]).when(reserve()).thenRejects('rate_limited', { retry_after_seconds: 20 });
});
rate('a start exactly 60 s old has left the window; one 59.999 s old has not', () => {
  const inWindow = spread(599, t - 30_000, t - 1);
  spec.given([opened({ recent_starts: [t - 60_000, ...inWindow] })]).when(reserve()).then([reserved()]);
  spec.given([opened({ recent_starts: [t - 59_999, ...inWindow] })]).when(reserve()).thenRejects('rate_limited', { retry_after_seconds: 1 });
  spec.given([opened({ recent_starts: [t - 61_000, t - 60_000, ...inWindow] })]).when(reserve()).then([reserved()]);
});
rate('retry_after_seconds counts until enough starts leave for one more, rounded up', () => {
  // 605 starts in the window: 6 must leave; the 6th oldest started 45.5 s ago and leaves in 14.5 s.
  const starts = [...spread(6, t - 59_000, t - 45_500), ...spread(599, t - 40_000, t)];
  spec.given([opened({ recent_starts: starts })]).when(reserve()).thenRejects('rate_limited', { retry_after_seconds: 15 });
});
rate('retry_after_seconds does not depend on the order starts were recorded in', () => {
  // Two processes' clocks differ by a little, and an opener may list starts in any order: the oldest
  // (50 s ago, so 10 s to wait) is last here.
  const starts = [...spread(599, t - 40_000, t - 1), t - 50_000];
  spec.given([opened({ recent_starts: starts })]).when(reserve()).thenRejects('rate_limited', { retry_after_seconds: 10 });
  const skewed: MeterEvent[] = [opened({ recent_starts: spread(599, t - 40_000, t - 1) }), reserved({ id: 'skew', now: iso(t - 50_000) }), settled('skew', 1, 1)];
  spec.given(skewed).when(reserve()).thenRejects('rate_limited', { retry_after_seconds: 10 });
});
rate('the rate limit holds across midnight through recent_starts', () => {
  const next = '2026-11-25';
  const now = at('00:00:20.000', next);
  const yesterday = spread(600, ms(at('23:59:30.000')), ms(at('23:59:59.900')));
  const given = [opened({ day: next, carried_from: day, recent_starts: yesterday }, at('00:00:00.000', next))];
  spec.given(given).when(reserve({ now })).thenRejects('rate_limited', { retry_after_seconds: 10 });
  spec.given(given).when(reserve({ now: at('00:00:30.000', next) })).then([reserved({ now: at('00:00:30.000', next) })]);
});
rate('a rejected request does not count as a start', () => {
  spec.given([opened()]).when(reserve({ budget: { monthly_token_budget: 0 } })).thenRejects('budget_exceeded');
  spec.given([opened()]).when({ type: 'RecordRejection', facts: facts('r0'), code: 'budget_exceeded', status: 429, inputTokens: 10, latencyMs: 1, refusedBy: 'monthly_token_budget', retryAfterSeconds: 60, now: noon }).thenState((state) => assert.equal(state.starts.toArray(), []));
});
rate.run();

// ---------------------------------------------------------------------------------------------

const active = suite('meter decider: 16 active requests per key');
const holds = (n: number, prefix = 'h') => Array.from({ length: n }, (_, i) => reserved({ id: `${prefix}${i}`, now: iso(t - 1000 + i) }));
active('the 16th concurrent reservation passes, the 17th is at_capacity', () => {
  spec.given([opened(), ...holds(15)]).when(reserve()).then([reserved()]);
  spec.given([opened(), ...holds(16)]).when(reserve()).thenRejects('at_capacity');
});
active('a settlement or an expiry frees a slot', () => {
  spec.given([opened(), ...holds(16), settled('h3', 10, 1)]).when(reserve()).then([reserved()]);
  spec.given([opened(), ...holds(16), ReservationExpired({ request_id: 'h3', input_tokens: 10, output_tokens: 100, at: noon })]).when(reserve()).then([reserved()]);
});
active('holds carried over midnight take slots until released', () => {
  const carried = Array.from({ length: 16 }, (_, i) => ({ ...carriedHold, request_id: `c${i}` }));
  spec.given([opened({ carried_holds: carried })]).when(reserve()).thenRejects('at_capacity');
  const released = CarriedHoldReleased({ request_id: 'c0', day: '2026-11-23', input_tokens: 10, output_tokens: 3, at: noon });
  spec.given([opened({ carried_holds: carried }), released]).when(reserve()).then([reserved()]);
});
active('a request id that already holds a reservation cannot reserve again (it would replace the hold)', () => {
  // X-Request-Id is the client's to choose: 17 concurrent requests under one id must not share one slot
  // and one hold, nor shrink a hold the engine is already generating against.
  const budget = { monthly_token_budget: 200 };
  spec.given([opened(), r1]).when(reserve({ id: 'r1', budget })).thenRejects('duplicate_request', { request_id: 'r1' });
  spec.given([opened(), ...holds(15), reserved({ id: 'x' })]).when(reserve({ id: 'x' })).thenRejects('duplicate_request');
  // Once settled, the id is free again: the new hold counts in full.
  spec.given([opened(), r1, settled('r1', 10, 20)]).when(reserve({ id: 'r1', budget })).then([reserved({ id: 'r1', applied: 100, budget })]);
  // A hold carried from yesterday under the same id is still running.
  spec.given([opened({ carried_holds: [carriedHold] })]).when(reserve({ id: 'late' })).thenRejects('duplicate_request');
});
active.run();

// ---------------------------------------------------------------------------------------------

const settling = suite('meter decider: settle, expire, renew');
const expiresAt = r1.data.expires_at;

settling('settlement charges the engine\'s real usage and releases the hold', () => {
  spec.given([opened(), r1]).when(settle('r1', 12, 37)).then([settled('r1', 12, 37)]);
  spec.given([opened({ month_input_tokens: 1000, month_output_tokens: 2000 }), r1]).when(settle('r1', 12, 37)).thenState((state) => {
    assert.is(state.holds.size, 0);
    assert.equal([state.monthInput, state.monthOutput, state.todayInput, state.todayOutput], [1012, 2037, 12, 37]);
    assert.equal(heldTokens(state), { input: 0, output: 0, todayInput: 0, todayOutput: 0 });
  });
});
settling('a disconnected client is billed for what was generated', () => {
  const command = { ...settle('r1', 10, 4), disconnected: true, status: 499, basis: 'relayed_frames' as const, generatedOutputTokens: 4, relayedOutputTokens: 3 };
  spec
    .given([opened(), r1])
    .when(command)
    .then([UsageSettled({ ...settled('r1', 10, 4).data, disconnected: true, status: 499, basis: 'relayed_frames', generated_output_tokens: 4, relayed_output_tokens: 3 })]);
});
settling('settling an unknown or an already settled request appends nothing', () => {
  spec.given([opened()]).when(settle('nope', 1, 1)).thenNothing();
  spec.given([opened(), r1, settled('r1', 10, 5)]).when(settle('r1', 10, 5)).thenNothing();
});
settling('a settlement after its hold expired is recorded beside the expiry, once, and charges nothing more', () => {
  const expired = ReservationExpired({ request_id: 'r1', input_tokens: 10, output_tokens: 100, at: expiresAt });
  const late = settle('r1', 10, 5, iso(ms(expiresAt) + 1_000));
  const { generated_output_tokens: _g, relayed_output_tokens: _r, ...lateFacts } = settled('r1', 10, 5, late.now).data;
  const recorded = LateUsageRecorded(lateFacts);
  spec.given([opened(), r1, expired]).when(late).then([recorded]);
  spec.given([opened(), r1, expired]).when(late).thenState((state) => {
    // The whole hold stays charged (the expiry's), the real usage is only recorded.
    assert.equal([state.monthInput, state.monthOutput, state.todayInput, state.todayOutput], [10, 100, 10, 100]);
    assert.equal(state.expired, []);
  });
  // Sent again: recorded once.
  spec.given([opened(), r1, expired, recorded]).when(late).thenNothing();
  // On a closed day too, without CarriedHoldEnded (the expiry said it).
  spec.given([opened(), r1, MeterClosed({ day, next_day: '2026-11-25', at: at('00:00:00.100', '2026-11-25') }), expired]).when(late).then([recorded]);
  // The id reused for a new hold: a settlement settles that hold.
  const again = reserved({ id: 'r1', now: iso(ms(expiresAt) + 500) });
  spec.given([opened(), r1, expired, again]).when(late).then([settled('r1', 10, 5, late.now)]);
});
settling('expiry happens only once expires_at <= now and charges the whole hold', () => {
  const expire = (now: string): MeterCommand => ({ type: 'Expire', requestId: 'r1', now });
  spec.given([opened(), r1]).when(expire(iso(ms(expiresAt) - 1))).thenNothing();
  spec.given([opened(), r1]).when(expire(expiresAt)).then([ReservationExpired({ request_id: 'r1', input_tokens: 10, output_tokens: 100, at: expiresAt })]);
  spec.given([opened(), r1]).when(expire(iso(ms(expiresAt) + 5_000))).thenState((state) => {
    assert.is(state.holds.size, 0);
    assert.equal([state.monthInput, state.monthOutput, state.todayInput, state.todayOutput], [10, 100, 10, 100]);
  });
});
settling('expiring an unknown, a settled or an expired request appends nothing', () => {
  const late = iso(ms(expiresAt) + 1);
  spec.given([opened()]).when({ type: 'Expire', requestId: 'r1', now: late }).thenNothing();
  spec.given([opened(), r1, settled('r1', 1, 1)]).when({ type: 'Expire', requestId: 'r1', now: late }).thenNothing();
  spec.given([opened(), r1, ReservationExpired({ request_id: 'r1', input_tokens: 10, output_tokens: 100, at: late })]).when({ type: 'Expire', requestId: 'r1', now: late }).thenNothing();
});
settling('a renewal moves expires_at: the old deadline no longer expires the hold, the new one does', () => {
  const later = iso(ms(expiresAt) + 300_000);
  const renewed = ReservationRenewed({ request_id: 'r1', expires_at: later, at: at('12:05:00.000') });
  spec.given([opened(), r1]).when({ type: 'Renew', requestId: 'r1', expiresAt: later, now: at('12:05:00.000') }).then([renewed]);
  spec.given([opened(), r1, renewed]).when({ type: 'Expire', requestId: 'r1', now: expiresAt }).thenNothing();
  spec.given([opened(), r1, renewed]).when({ type: 'Expire', requestId: 'r1', now: later }).then([ReservationExpired({ request_id: 'r1', input_tokens: 10, output_tokens: 100, at: later })]);
});
settling('renewing an unknown or finished request appends nothing', () => {
  spec.given([opened()]).when({ type: 'Renew', requestId: 'r1', expiresAt: at('13:00:00.000'), now: noon }).thenNothing();
  spec.given([opened(), r1, settled('r1', 1, 1)]).when({ type: 'Renew', requestId: 'r1', expiresAt: at('13:00:00.000'), now: noon }).thenNothing();
});
settling('a renewal never shortens a hold, and a resent renewal appends nothing', () => {
  const renew = (expires: string): MeterCommand => ({ type: 'Renew', requestId: 'r1', expiresAt: expires, now: at('12:05:00.000') });
  spec.given([opened(), r1]).when(renew(expiresAt)).thenNothing();
  spec.given([opened(), r1]).when(renew(at('12:05:00.000'))).thenNothing();
  const renewed = ReservationRenewed({ request_id: 'r1', expires_at: at('12:20:00.000'), at: at('12:05:00.000') });
  spec.given([opened(), r1, renewed]).when(renew(at('12:20:00.000'))).thenNothing();
});
settling.run();

// ---------------------------------------------------------------------------------------------

const boundaries = suite('meter decider: UTC month and day boundaries');
const d = '2026-11-24';
const next = '2026-11-25';
const late = at('23:59:59.900', d);
const straddling = reserved({ id: 'mid', input: 10, applied: 100, now: late });
const carriedMid = { request_id: 'mid', day: d, input_tokens: 10, output_tokens: 100, at: late, expires_at: straddling.data.expires_at, lease_holder: null };
const nextOpened = opened({ day: next, carried_from: d, month_input_tokens: 500, month_output_tokens: 500, carried_holds: [carriedMid], recent_starts: [ms(late)] }, at('00:00:00.100', next));

boundaries('a MeterOpened on the 1st of the month starts the month from zero', () => {
  const first = opened({ day: '2026-12-01', carried_from: null, month_input_tokens: 0, month_output_tokens: 0 }, '2026-12-01T00:00:00.000Z');
  spec.given([first]).when(reserve({ maxTokens: 990, maxTokensRequested: 990, now: '2026-12-01T00:00:01.000Z', budget: { monthly_token_budget: 1000 } })).then([reserved({ budget: { monthly_token_budget: 1000 },  applied: 990, requested: 990, now: '2026-12-01T00:00:01.000Z' })]);
});
boundaries('a day opened mid-month carries the month-to-date, and starts its day at zero', () => {
  const mid = opened({ month_input_tokens: 400, month_output_tokens: 500 });
  spec.given([mid]).when(reserve({ budget: { monthly_token_budget: 1000, daily_token_budget: 1000 } })).then([reserved({ budget: { monthly_token_budget: 1000, daily_token_budget: 1000 },  applied: 90, clampedBy: 'monthly_token_budget' })]);
  spec.given([mid]).when(reserve()).thenState((state) => assert.equal([state.day, state.monthInput, state.monthOutput, state.todayInput, state.todayOutput], [d, 400, 500, 0, 0]));
});
boundaries('a reservation at 23:59:59.9 on day D settles after midnight on day D\'s stream', () => {
  spec.given([opened({ day: d })]).when(reserve({ id: 'mid', now: late })).then([straddling]);
  const afterMidnight = at('00:00:05.000', next);
  spec.given([opened(), straddling]).when(settle('mid', 10, 30, afterMidnight)).then([settled('mid', 10, 30, afterMidnight)]);
  // Day D's books: the settlement counts on day D, whenever it landed.
  spec.given([opened(), straddling]).when(settle('mid', 10, 30, afterMidnight)).thenState((state) => assert.equal([state.todayInput, state.todayOutput], [10, 30]));
});
boundaries('day D+1 carries the straddling hold and releases it with CarriedHoldReleased', () => {
  const release: MeterCommand = { type: 'ReleaseCarried', requestId: 'mid', day: d, inputTokens: 10, outputTokens: 30, now: at('00:00:06.000', next) };
  const released = CarriedHoldReleased({ request_id: 'mid', day: d, input_tokens: 10, output_tokens: 30, at: at('00:00:06.000', next) });
  spec.given([nextOpened]).when(release).then([released]);
  spec.given([nextOpened]).when(release).thenState((state) => {
    assert.is(state.holds.size, 0);
    // The month is charged what day D charged; day D+1 is not.
    assert.equal([state.monthInput, state.monthOutput, state.todayInput, state.todayOutput], [510, 530, 0, 0]);
  });
  // Released once; not settled, expired or renewed on D+1's stream (those land on D's).
  spec.given([nextOpened, released]).when(release).thenNothing();
  spec.given([nextOpened]).when(settle('mid', 10, 30, at('00:00:05.000', next))).thenNothing();
  spec.given([nextOpened]).when({ type: 'Expire', requestId: 'mid', now: at('01:00:00.000', next) }).thenNothing();
  // Renewed on its own day's stream, where the reaper expires it: a renewal on D+1's would leave D's deadline as it was.
  spec.given([nextOpened]).when({ type: 'Renew', requestId: 'mid', expiresAt: at('00:30:00.000', next), now: at('00:05:00.000', next) }).thenNothing();
  // A release naming the wrong day, an unknown request, or a hold of the stream's own day appends nothing.
  spec.given([nextOpened]).when({ ...release, day: '2026-11-23' }).thenNothing();
  spec.given([nextOpened]).when({ ...release, requestId: 'other' }).thenNothing();
  const own = reserved({ id: 'own', now: at('00:01:00.000', next) });
  spec.given([nextOpened, own]).when({ ...release, requestId: 'own', day: next }).thenNothing();
});
boundaries('day D+1 counts the carried hold against the month while it is open, not against the day', () => {
  // Month: 1000 budget, 1000 used + 110 held: nothing fits. Day: nothing used today.
  spec.given([nextOpened]).when(reserve({ now: at('00:00:01.000', next), budget: { monthly_token_budget: 1100 } })).thenRejects('budget_exceeded', { budget: 'monthly_token_budget' });
  spec.given([nextOpened]).when(reserve({ now: at('00:00:01.000', next), budget: { daily_token_budget: 110 } })).then([reserved({ budget: { daily_token_budget: 110 },  applied: 100, now: at('00:00:01.000', next) })]);
});
boundaries('a hold carried over the month boundary charges its own month, not the new one', () => {
  const oct31 = '2026-10-31';
  const lastMinute = '2026-10-31T23:59:59.900Z';
  const hold = { request_id: 'oct', day: oct31, input_tokens: 10, output_tokens: 100, at: lastMinute, expires_at: '2026-11-01T00:09:59.900Z', lease_holder: null };
  const nov1 = opened({ day: '2026-11-01', carried_from: null, carried_holds: [hold] }, '2026-11-01T00:00:00.000Z');
  const now = '2026-11-01T00:00:10.000Z';
  // October's hold is October's: November's budget is whole while it runs (it still takes an active slot).
  spec.given([nov1]).when(reserve({ now, budget: { monthly_token_budget: 110, monthly_input_token_budget: 10, monthly_output_token_budget: 100 } })).then([reserved({ budget: { monthly_token_budget: 110, monthly_input_token_budget: 10, monthly_output_token_budget: 100 },  now })]);
  const released = CarriedHoldReleased({ request_id: 'oct', day: oct31, input_tokens: 10, output_tokens: 60, at: now });
  spec.given([nov1]).when({ type: 'ReleaseCarried', requestId: 'oct', day: oct31, inputTokens: 10, outputTokens: 60, now }).then([released]);
  spec.given([nov1, released]).when(reserve({ now })).thenState((state) => assert.equal([state.monthInput, state.monthOutput], [0, 0]));
  const carried16 = Array.from({ length: 16 }, (_, i) => ({ ...hold, request_id: `oct${i}` }));
  spec.given([opened({ day: '2026-11-01', carried_from: null, carried_holds: carried16 }, '2026-11-01T00:00:00.000Z')]).when(reserve({ now })).thenRejects('at_capacity');
});
boundaries('utcDay is the UTC calendar day of an instant, whatever offset it is written with', () => {
  assert.is(utcDay(late), '2026-11-24');
  assert.is(utcDay('2026-11-25T00:00:00.000Z'), '2026-11-25');
  assert.is(utcDay(new Date('2026-11-25T01:30:00+02:00')), '2026-11-24');
  assert.is(utcDay('2026-11-25T01:30:00+02:00'), '2026-11-24');
  assert.is(utcDay('2026-11-24T20:00:00-05:00'), '2026-11-25');
  assert.is(utcDay('2026-12-01T00:00:00.000Z'), '2026-12-01');
});
boundaries('instants are compared as instants, not as text', () => {
  // 14:10+02:00 is 12:10Z, r1's deadline: the hold expires; 14:09:59.999+02:00 is before it.
  spec.given([opened(), r1]).when({ type: 'Expire', requestId: 'r1', now: '2026-11-24T14:09:59.999+02:00' }).thenNothing();
  spec.given([opened(), r1]).when({ type: 'Expire', requestId: 'r1', now: '2026-11-24T14:10:00+02:00' }).then([ReservationExpired({ request_id: 'r1', input_tokens: 10, output_tokens: 100, at: '2026-11-24T14:10:00+02:00' })]);
  // A reservation's deadline is written in UTC whatever its now was written with.
  spec.given([opened()]).when(reserve({ now: '2026-11-24T14:00:00+02:00' })).thenState((state) => assert.is(state.holds.get('r1')?.expiresAt, '2026-11-24T12:10:00.000Z'));
});

// ---------------------------------------------------------------------------------------------

boundaries('closing a day: the opener of the next day closes it; a reservation there is refused, to be made on the next day', () => {
  const closed = MeterClosed({ day: d, next_day: next, at: at('00:00:00.050', next) });
  spec.given([opened({ day: d })]).when({ type: 'CloseMeter', nextDay: next, now: at('00:00:00.050', next) }).then([closed]);
  spec.given([opened({ day: d }), closed]).when({ type: 'CloseMeter', nextDay: next, now: at('00:00:00.060', next) }).thenNothing();
  spec.given([opened({ day: d }), closed]).when(reserve({ id: 'late', now: late })).thenRejects('meter_closed');
  // The holds of a closed day are still settled and expired there, saying the next day carried them.
  spec
    .given([opened({ day: d }), straddling, closed])
    .when(settle('mid', 10, 60, at('00:00:01.000', next)))
    .then([settled('mid', 10, 60, at('00:00:01.000', next)), CarriedHoldEnded({ request_id: 'mid', day: d, input_tokens: 10, output_tokens: 60, at: at('00:00:01.000', next) })]);
});
boundaries('utcDay: the UTC day of an instant, asked again and again across midnight (it keeps the last day it computed)', () => {
  const instants = ['2026-11-25T23:59:59.999Z', '2026-11-26T00:00:00.000Z', '2026-11-25T23:59:59.999Z', '2024-02-29T23:59:59.999Z', '2024-03-01T00:00:00.000Z', '1969-12-31T23:59:59.999Z', '1970-01-01T00:00:00.000Z'];
  for (const iso of [...instants, ...instants.reverse()]) {
    assert.is(utcDay(new Date(iso)), iso.slice(0, 10), iso);
    assert.is(utcDay(new Date(iso)), iso.slice(0, 10), `${iso}, asked again`);
  }
  assert.is(utcDay('2026-11-26T01:30:00+02:00'), '2026-11-25');
  assert.throws(() => utcDay(new Date(NaN)));
});

boundaries.run();

const records = suite('meter decider: rejections recorded, metadata only');
records('a rejected request is recorded with its metadata, what refused it and the retry time, and changes nothing', () => {
  const command: MeterCommand = {
    type: 'RecordRejection',
    facts: facts('r9'),
    code: 'budget_exceeded',
    status: 429,
    inputTokens: 12,
    latencyMs: 0.4,
    refusedBy: 'daily_token_budget',
    retryAfterSeconds: 43_200,
    now: noon,
  };
  spec
    .given([opened()])
    .when(command)
    .then([RequestRejected({ ...facts('r9'), code: 'budget_exceeded', status: 429, input_tokens: 12, latency_ms: 0.4, at: noon, refused_by: 'daily_token_budget', retry_after_seconds: 43_200 })]);
  const invalid: MeterCommand = { ...command, code: 'invalid_request', status: 400, refusedBy: null, retryAfterSeconds: null };
  spec
    .given([opened()])
    .when(invalid)
    .then([RequestRejected({ ...facts('r9'), code: 'invalid_request', status: 400, input_tokens: 12, latency_ms: 0.4, at: noon, refused_by: null, retry_after_seconds: null })]);
  spec.given([opened(), r1]).when(command).thenState((state) => {
    assert.equal(state, foldEvents(meterDecider, meterDecider.initialState(), [opened(), r1]));
  });
});
records('no event of the meter catalogue can carry a prompt or a completion', () => {
  const withPrompt = { ...RequestRejected({ ...facts('r9'), code: 'rate_limited', status: 429, input_tokens: 1, latency_ms: 1, at: noon, refused_by: 'per_minute', retry_after_seconds: 3 }) };
  assert.throws(() => meterEvents.check({ type: 'RequestRejected', data: { ...withPrompt.data, prompt: 'secret marker' } }));
  assert.throws(() => meterEvents.check({ type: 'UsageSettled', data: { ...settled('r1', 1, 1).data, completion: 'secret marker' } }));
  assert.throws(() => meterEvents.check({ type: 'BudgetReserved', data: { ...r1.data, prompt: 'secret marker' } }));
});
records.run();

// ---------------------------------------------------------------------------------------------

const leasing = suite('meter decider: slot leases (engine calls started before the append is durable)');
const leaseTtl = 10_000;
const asA = { holder: 'gw-a', ttlMs: leaseTtl };
const leased = (slots: number, o: { holder?: string; expires?: string; now?: string } = {}) =>
  SlotsLeased({ holder: o.holder ?? 'gw-a', slots, expires_at: o.expires ?? iso(ms(o.now ?? noon) + leaseTtl), at: o.now ?? noon });
const underA = (id: string) => reserved({ id, holder: 'gw-a' });

leasing('with no standing lease, a reservation takes a lease of one slot and reserves in it (this one waits for the append)', () => {
  spec.given([opened()]).when(reserve({ lease: asA })).then([leased(1), reserved({ holder: 'gw-a' })]);
});
leasing('a reservation that fits in the standing lease appends only its hold (its engine call may start at once)', () => {
  spec.given([opened(), leased(2), underA('x')]).when(reserve({ lease: asA })).then([reserved({ holder: 'gw-a' })]);
});
leasing('a full lease grows by one slot while the key has one free; at the cap it is at_capacity', () => {
  spec.given([opened(), leased(1), underA('x')]).when(reserve({ lease: asA })).then([leased(2), reserved({ holder: 'gw-a' })]);
  spec.given([opened(), leased(1), underA('x'), ...holds(15)]).when(reserve({ lease: asA })).thenRejects('at_capacity');
});
leasing("a lease's slots are taken for every other process, idle or not: the cap of 16 holds across processes", () => {
  const given = [opened(), leased(10), underA('x'), ...holds(6)];
  spec.given(given).when(reserve()).thenRejects('at_capacity');
  spec.given(given).when(reserve({ lease: { holder: 'gw-b', ttlMs: leaseTtl } })).thenRejects('at_capacity');
  // The holder still has nine idle slots of its own.
  spec.given(given).when(reserve({ lease: asA })).then([reserved({ holder: 'gw-a' })]);
  // Holds running under a lease beyond its size (it was shrunk meanwhile by a late settlement) count each.
  spec.given([opened(), leased(1), underA('x'), underA('y'), ...holds(14)]).when(reserve()).thenRejects('at_capacity');
});
leasing('a lapsed lease counts for nothing: its holds take a slot each, and a new lease covers them', () => {
  const lapsed = leased(16, { expires: at('11:59:59.999') });
  const given = [opened(), lapsed, underA('x'), underA('y')];
  spec.given(given).when(reserve({ lease: { holder: 'gw-b', ttlMs: leaseTtl } })).then([leased(1, { holder: 'gw-b' }), reserved({ holder: 'gw-b' })]);
  spec.given(given).when(reserve({ lease: asA })).then([leased(3), reserved({ holder: 'gw-a' })]);
  spec.given([...given, ...holds(14)]).when(reserve({ lease: asA })).thenRejects('at_capacity');
});
leasing('a lease in its second half is renewed alongside the reservation; in its last quarter (at most its last 5 s) it is taken again (the reservation waits)', () => {
  const lasting = (left: number) => leased(3, { expires: iso(ms(noon) + left) });
  spec.given([opened(), lasting(leaseTtl / 2)]).when(reserve({ lease: asA })).then([reserved({ holder: 'gw-a' })]);
  const renewed = SlotLeaseRenewed({ holder: 'gw-a', expires_at: iso(ms(noon) + leaseTtl), at: noon });
  spec.given([opened(), lasting(leaseTtl / 2 - 1)]).when(reserve({ lease: asA })).then([renewed, reserved({ holder: 'gw-a' })]);
  spec.given([opened(), lasting(leaseTtl / 4)]).when(reserve({ lease: asA })).then([renewed, reserved({ holder: 'gw-a' })]);
  spec.given([opened(), lasting(leaseTtl / 4 - 1)]).when(reserve({ lease: asA })).then([leased(3), reserved({ holder: 'gw-a' })]);
  // A long lease (60 s): renewed alongside down to its last 5 s, not only down to its last quarter (15 s).
  const asLong = { holder: 'gw-a', ttlMs: 60_000 };
  const renewedLong = SlotLeaseRenewed({ holder: 'gw-a', expires_at: iso(ms(noon) + 60_000), at: noon });
  spec.given([opened(), lasting(8_000)]).when(reserve({ lease: asLong })).then([renewedLong, reserved({ holder: 'gw-a' })]);
  spec.given([opened(), lasting(5_000)]).when(reserve({ lease: asLong })).then([renewedLong, reserved({ holder: 'gw-a' })]);
  spec.given([opened(), lasting(4_999)]).when(reserve({ lease: asLong })).then([leased(3, { expires: iso(ms(noon) + 60_000) }), reserved({ holder: 'gw-a' })]);
  // Renewed, the lease keeps its size and lasts the whole TTL again.
  spec.given([opened(), lasting(leaseTtl / 2 - 1)]).when(reserve({ lease: asA })).thenState((state) => assert.equal(state.leases['gw-a'], { slots: 3, expiresAt: iso(ms(noon) + leaseTtl) }));
});
leasing('a settlement shrinks its lease to the requests its holder still runs and has waiting, never under one slot', () => {
  const given = [opened(), leased(4), underA('w'), underA('x'), underA('y')];
  const byA = (waiting: number) => ({ ...settle('x', 10, 5, noon), lease: { holder: 'gw-a', waiting } });
  spec.given(given).when(byA(0)).then([settled('x', 10, 5, noon), leased(2, { expires: iso(ms(noon) + leaseTtl) })]);
  spec.given(given).when(byA(1)).then([settled('x', 10, 5, noon), leased(3)]);
  spec.given(given).when(byA(2)).then([settled('x', 10, 5, noon)]);
  spec.given([opened(), leased(1), underA('x')]).when(byA(0)).then([settled('x', 10, 5, noon)]);
  // The shrunk lease keeps its expiry; a settlement without a lease, or of a hold outside it, leaves it be.
  spec.given([opened(), leased(4, { now: at('11:59:58.000') }), underA('x')]).when(byA(0)).then([settled('x', 10, 5, noon), leased(1, { now: noon, expires: iso(ms(at('11:59:58.000')) + leaseTtl) })]);
  spec.given(given).when(settle('x', 10, 5, noon)).then([settled('x', 10, 5, noon)]);
  spec.given([...given, r1]).when({ ...settle('r1', 10, 5, noon), lease: { holder: 'gw-a', waiting: 0 } }).then([settled('r1', 10, 5, noon)]);
});
leasing('leases standing at midnight are carried into the next day, and their slots stay taken there', () => {
  const carriedLease = { holder: 'gw-a', slots: 15, expires_at: iso(ms(noon) + leaseTtl) };
  const given = [opened({ carried_leases: [carriedLease], carried_holds: [{ ...carriedHold, lease_holder: 'gw-a' }] }), r1];
  spec.given(given).when(reserve({ id: 'r2' })).thenRejects('at_capacity');
  spec.given(given).when(reserve({ id: 'r2', lease: asA })).then([reserved({ id: 'r2', holder: 'gw-a' })]);
});
leasing("a hold whose lease lapsed is expired (charged whole, like any expiry): a dead process's holds free the key's slots within a lease, not a TTL", () => {
  const given = [opened(), leased(2), underA('x'), underA('y')];
  const lapsedAt = iso(ms(noon) + leaseTtl);
  const expire = (requestId: string, now: string): MeterCommand => ({ type: 'Expire', requestId, now });
  // The lease stands: its holds wait for their own expiry.
  spec.given(given).when(expire('x', iso(ms(lapsedAt) - 1))).thenNothing();
  spec.given(given).when(expire('x', lapsedAt)).then([ReservationExpired({ request_id: 'x', input_tokens: 10, output_tokens: 100, at: lapsedAt })]);
  spec.given([...given, ReservationExpired({ request_id: 'x', input_tokens: 10, output_tokens: 100, at: lapsedAt })])
    .when(expire('y', lapsedAt))
    .thenState((state) => {
      assert.is(state.holds.size, 0);
      assert.equal([state.monthInput, state.monthOutput], [20, 200]);
    });
  // Renewed (the sweep of a living holder, or its next reservation), or taken again: it stands, its holds stay.
  const renewed = SlotLeaseRenewed({ holder: 'gw-a', expires_at: iso(ms(noon) + 2 * leaseTtl), at: iso(ms(noon) + leaseTtl / 2) });
  spec.given([...given, renewed]).when(expire('x', lapsedAt)).thenNothing();
  spec.given([...given, leased(2, { now: iso(ms(lapsedAt) + 5) })]).when(expire('x', iso(ms(lapsedAt) + 10))).thenNothing();
  // A hold made without a lease waits for its own expiry; so does one on a closed day (its lease is renewed on the next day's stream).
  spec.given([opened(), r1]).when(expire('r1', lapsedAt)).thenNothing();
  const closed = MeterClosed({ day, next_day: '2026-11-25', at: at('12:05:00.000') });
  spec.given([...given, closed]).when(expire('x', at('12:05:00.100'))).thenNothing();
});
leasing('a holder renews its lease while requests run under it: once less than half would be left at its next check; lapsed, taken again at their number', () => {
  const renewLease = (now: string, holder = 'gw-a'): MeterCommand => ({ type: 'RenewLease', holder, ttlMs: leaseTtl, nextCheckMs: 1_000, now });
  const given = [opened(), leased(4), underA('x'), underA('y')];
  // Half the TTL still in hand at the next check: nothing.
  spec.given(given).when(renewLease(iso(ms(noon) + leaseTtl / 2 - 1_000))).thenNothing();
  const at6 = iso(ms(noon) + leaseTtl / 2 - 999);
  spec.given(given).when(renewLease(at6)).then([SlotLeaseRenewed({ holder: 'gw-a', expires_at: iso(ms(at6) + leaseTtl), at: at6 })]);
  const after = iso(ms(noon) + leaseTtl + 1);
  spec.given(given).when(renewLease(after)).then([leased(2, { now: after })]);
  // Nothing runs under it (or another holder asks), or the day is closed or not opened: nothing.
  spec.given([opened(), leased(4)]).when(renewLease(at6)).thenNothing();
  spec.given(given).when(renewLease(at6, 'gw-b')).thenNothing();
  spec.given([...given, MeterClosed({ day, next_day: '2026-11-25', at: at6 })]).when(renewLease(at6)).thenNothing();
  spec.given([]).when(renewLease(at6)).thenNothing();
});
leasing('events written before leases existed (version 1) read as holds that take a slot each', () => {
  const v1Reserved = { ...r1.data } as Record<string, unknown>;
  delete v1Reserved.lease_holder;
  const v1Opened = { ...opened({ carried_holds: [carriedHold] }).data } as Record<string, unknown>;
  delete v1Opened.carried_leases;
  v1Opened.carried_holds = [{ ...carriedHold, lease_holder: undefined }].map(({ lease_holder: _, ...h }) => h);
  const stored = [
    { type: 'MeterOpened', data: v1Opened, metadata: {} },
    { type: 'BudgetReserved', data: v1Reserved, metadata: { schema_version: 1 } },
  ];
  const [openedV2, reservedV2] = stored.map((e) => meterEvents.parse(e as never));
  assert.equal(openedV2, opened({ carried_holds: [carriedHold] }));
  assert.equal(reservedV2, { ...r1, data: { ...r1.data, budgets: null, limits: null } });
});
leasing('events written before budgets, prices and refusals were recorded read with them unknown (null), money in micro-units', () => {
  const v2Reserved = { ...r1.data } as Record<string, unknown>;
  delete v2Reserved.budgets;
  delete v2Reserved.limits;
  assert.equal(meterEvents.parse({ type: 'BudgetReserved', data: v2Reserved, metadata: { schema_version: 2 } }).data, { ...r1.data, budgets: null, limits: null });
  const { cost_micros: _m, price_per_gpu_second_micros: _p, basis: _b, generated_output_tokens: _g, relayed_output_tokens: _rl, ...v1Settled } = settled('r1', 10, 5).data;
  // Its float becomes exact micro-units, and goes: no event read today carries money as a float.
  assert.equal(meterEvents.parse({ type: 'UsageSettled', data: { ...v1Settled, cost: 0.1 + 0.2 }, metadata: {} }).data, {
    ...v1Settled,
    cost_micros: 300_000,
    price_per_gpu_second_micros: null,
    basis: null,
    generated_output_tokens: null,
    relayed_output_tokens: null,
  });
  // Version 2 did not record a cut-short stream's generated and relayed tokens.
  const { generated_output_tokens: _g2, relayed_output_tokens: _r2, ...v2Settled } = { ...settled('r1', 10, 5).data, disconnected: true };
  assert.equal(meterEvents.parse({ type: 'UsageSettled', data: { ...v2Settled, cost: 0.003 }, metadata: { schema_version: 2 } }).data, { ...v2Settled, generated_output_tokens: null, relayed_output_tokens: null });
  const rejected = RequestRejected({ ...facts('r9'), code: 'queue_full', status: 429, input_tokens: 1, latency_ms: 1, at: noon, refused_by: 'max_queued', retry_after_seconds: 1 }).data;
  const { refused_by: _r, retry_after_seconds: _s, ...v1Rejected } = rejected;
  assert.equal(meterEvents.parse({ type: 'RequestRejected', data: v1Rejected, metadata: {} }).data, { ...v1Rejected, refused_by: null, retry_after_seconds: null });
});
leasing.run();

// ---------------------------------------------------------------------------------------------

const queueing = suite('meter decider: 64 queued per key, across processes');
const entryTtl = 30_000;
type Queue = Extract<MeterCommand, { type: 'Queue' }>;
const queueCmd = (id: string, o: Partial<Omit<Queue, 'type' | 'requestId'>> = {}): Queue => ({ type: 'Queue', requestId: id, holder: 'gw-a', maxQueued: 64, ttlMs: entryTtl, now: noon, ...o });
const queued = (id: string, o: { holder?: string; now?: string; ttl?: number } = {}) => {
  const { holder = 'gw-a', now = noon, ttl = entryTtl } = o;
  return RequestQueued({ request_id: id, holder, at: now, expires_at: iso(ms(now) + ttl) });
};
/** `n` waiting requests, split between two processes, queued over the last `n` ms. */
const waiting = (n: number, prefix = 'w') => Array.from({ length: n }, (_, i) => queued(`${prefix}${i}`, { holder: i % 2 === 0 ? 'gw-a' : 'gw-b', now: iso(t - n + i) }));

queueing('a request that found no free slot waits: its entry carries its process and lapses after the TTL', () => {
  spec.given([opened(), ...holds(16)]).when(queueCmd('q')).then([queued('q')]);
});
queueing('queue_full once the standing entries of every process number maxQueued', () => {
  spec.given([opened(), ...waiting(63)]).when(queueCmd('q')).then([queued('q')]);
  spec.given([opened(), ...waiting(64)]).when(queueCmd('q')).thenRejects('queue_full', { queued: 64 });
  spec.given([opened(), ...waiting(64)]).when(queueCmd('q', { holder: 'gw-b' })).thenRejects('queue_full');
  spec.given([opened(), ...waiting(2)]).when(queueCmd('q', { maxQueued: 2 })).thenRejects('queue_full');
});
queueing('entries that lapsed (their process died) do not count, and leave the state with the next entry', () => {
  const dead = queued('dead', { holder: 'gw-dead', now: iso(t - entryTtl - 1) });
  const given = [opened(), dead, ...waiting(63)];
  assert.is(queuedRequests(foldGiven(given), t), 63);
  spec.given(given).when(queueCmd('q')).then([queued('q')]);
  spec.given(given).when(queueCmd('q')).thenState((state) => {
    assert.not.ok(state.queue.dead, 'the lapsed entry is gone');
    assert.is(queuedRequests(state, t), 64);
  });
});
queueing("a waiting request's reservation takes its entry out of the queue", () => {
  const given = [opened(), ...waiting(64)];
  spec.given([...given, reserved({ id: 'w0' })]).when(queueCmd('q')).then([queued('q')]);
  spec.given(given).when(reserve({ id: 'w0' })).thenState((state) => assert.not.ok(state.queue.w0));
});
queueing('a request that gives up leaves the queue (QueueLeft); leaving twice, or without an entry, appends nothing', () => {
  const given = [opened(), ...waiting(64)];
  spec.given(given).when({ type: 'LeaveQueue', requestId: 'w5', now: noon }).then([QueueLeft({ request_id: 'w5', at: noon })]);
  spec.given([...given, QueueLeft({ request_id: 'w5', at: noon })]).when(queueCmd('q')).then([queued('q')]);
  spec.given([...given, QueueLeft({ request_id: 'w5', at: noon })]).when({ type: 'LeaveQueue', requestId: 'w5', now: noon }).thenNothing();
  spec.given([...given, reserved({ id: 'w5' })]).when({ type: 'LeaveQueue', requestId: 'w5', now: noon }).thenNothing();
});
queueing('queued again while its entry stands (its reservation was decided again and refused): nothing new', () => {
  spec.given([opened(), queued('q', { now: at('11:59:50.000') })]).when(queueCmd('q')).thenNothing();
  // Under another process, or while it holds a reservation, the request id is someone else's.
  spec.given([opened(), queued('q', { holder: 'gw-b' })]).when(queueCmd('q')).thenRejects('duplicate_request');
  spec.given([opened(), reserved({ id: 'q' })]).when(queueCmd('q')).thenRejects('duplicate_request');
  // Its own entry lapsed (a stalled process): it queues again, if there is room.
  const lapsed = queued('q', { now: iso(t - entryTtl - 1) });
  spec.given([opened(), lapsed]).when(queueCmd('q')).then([queued('q')]);
  spec.given([opened(), lapsed, ...waiting(64)]).when(queueCmd('q')).thenRejects('queue_full');
});
queueing('a process renews the entries it still has waiting: standing ones only, its own only, not before half the TTL', () => {
  const older = at('11:59:40.000');
  const given = [opened(), queued('a1', { now: older }), queued('a2', { now: older }), queued('b1', { holder: 'gw-b', now: older }), queued('gone', { now: iso(t - entryTtl - 1) })];
  const renew = (ids: string[], now = noon): MeterCommand => ({ type: 'RenewQueued', holder: 'gw-a', requestIds: ids, ttlMs: entryTtl, now });
  spec.given(given).when(renew(['a1', 'a2', 'b1', 'gone', 'unknown'])).then([QueueEntriesRenewed({ holder: 'gw-a', request_ids: ['a1', 'a2'], expires_at: iso(t + entryTtl), at: noon })]);
  spec.given(given).when(renew(['a1'])).thenState((state) => assert.is(state.queue.a1.expiresAt, iso(t + entryTtl)));
  spec.given(given).when(renew(['gone', 'b1'])).thenNothing();
  // Renewed at the same instant it was queued: the expiry would not move.
  spec.given([opened(), queued('a1')]).when(renew(['a1'])).thenNothing();
});
queueing('a closed day refuses queue commands (its queue went to the next day); an unopened one too', () => {
  const closed = MeterClosed({ day, next_day: '2026-11-25', at: at('23:59:59.990') });
  spec.given([opened(), queued('q'), closed]).when(queueCmd('r')).thenRejects('meter_closed');
  spec.given([opened(), queued('q'), closed]).when({ type: 'LeaveQueue', requestId: 'q', now: noon }).thenRejects('meter_closed');
  spec.given([opened(), queued('q'), closed]).when({ type: 'RenewQueued', holder: 'gw-a', requestIds: ['q'], ttlMs: entryTtl, now: noon }).thenRejects('meter_closed');
  spec.given([]).when(queueCmd('q')).thenRejects('meter_not_opened');
});
queueing('entries carried over midnight count against the next day\'s bound, and leave it with their reservation', () => {
  const carried = waiting(64).map((e) => ({ request_id: e.data.request_id, holder: e.data.holder, at: e.data.at, expires_at: e.data.expires_at }));
  spec.given([opened({ carried_queue: carried })]).when(queueCmd('q')).thenRejects('queue_full');
  spec.given([opened({ carried_queue: carried }), reserved({ id: 'w0' })]).when(queueCmd('q')).then([queued('q')]);
});
queueing('a MeterOpened of version 2 (no queue then) reads as carrying no queue', () => {
  const v2 = { ...opened().data } as Record<string, unknown>;
  delete v2.carried_queue;
  assert.equal(meterEvents.parse({ type: 'MeterOpened', data: v2, metadata: { schema_version: 2 } } as never), opened());
});
queueing.run();

// ---------------------------------------------------------------------------------------------

const balance = suite('meter decider: the opening balance carried from the previous day');
const prev = '2026-11-23';
const before = (time: string) => at(time, prev);
const midnight = at('00:00:00.000'); // the 24th's, when the 23rd is closed and its balance read
const prevOpened = (o: Partial<MeterOpening> = {}) => opened({ day: prev, carried_from: '2026-11-20', month_input_tokens: 1000, month_output_tokens: 2000, ...o }, before('00:00:00.000'));
const prevClosed = MeterClosed({ day: prev, next_day: day, at: midnight });
/** The balance of `nextDay` read at `now` from the previous day's events. */
const balanceAfter = (events: MeterEvent[], nextDay = day, now = midnight) => balanceFrom(key_id, nextDay, events[0].type === 'MeterOpened' ? events[0].data.day : prev, foldGiven(events), ms(now));

balance('the same month: its tokens are carried (settled and expired), not those still held', () => {
  const events = [
    prevOpened(),
    reserved({ id: 's', input: 10, applied: 50, now: before('09:00:00.000') }),
    settled('s', 10, 30, before('09:00:05.000')),
    reserved({ id: 'x', input: 5, applied: 20, now: before('10:00:00.000'), ttl: 1000 }),
    ReservationExpired({ request_id: 'x', input_tokens: 5, output_tokens: 20, at: before('10:00:02.000') }),
    reserved({ id: 'open', input: 7, applied: 70, now: before('23:00:00.000'), ttl: 7_200_000 }),
    prevClosed,
  ];
  const b = balanceAfter(events);
  assert.equal([b.key_id, b.day, b.carried_from, b.month_input_tokens, b.month_output_tokens], [key_id, day, prev, 1015, 2050]);
  assert.equal(b.carried_holds.map((h) => h.request_id), ['open']);
  // Given that balance, the next day opens with it, and its month counts the carried hold too.
  spec.given([]).when({ type: 'OpenMeter', opening: b, now: midnight }).thenState((state) => {
    assert.equal([state.monthInput, state.monthOutput], [1015, 2050]);
    assert.equal(heldTokens(state), { input: 7, output: 70, todayInput: 0, todayOutput: 0 }, "the 23rd's open hold still counts against the month, not against the 24th");
  });
});
balance('a different month: tokens start from zero; holds, standing leases, queue entries and recent starts are still carried', () => {
  const last = '2026-11-30';
  const first = '2026-12-01';
  const turn = at('00:00:00.000', first);
  const events = [
    opened({ day: last, carried_from: '2026-11-29', month_input_tokens: 900, month_output_tokens: 900 }, at('00:00:00.000', last)),
    reserved({ id: 's', now: at('09:00:00.000', last) }),
    settled('s', 10, 10, at('09:00:01.000', last)),
    SlotsLeased({ holder: 'gw-a', slots: 3, expires_at: iso(ms(turn) + 30_000), at: at('23:59:50.000', last) }),
    reserved({ id: 'open', holder: 'gw-a', now: at('23:59:50.000', last) }),
    queued('waits', { now: at('23:59:55.000', last) }),
    MeterClosed({ day: last, next_day: first, at: turn }),
  ];
  const b = balanceAfter(events, first, turn);
  assert.equal([b.carried_from, b.month_input_tokens, b.month_output_tokens], [last, 0, 0]);
  assert.equal(b.carried_holds, [{ request_id: 'open', day: last, input_tokens: 10, output_tokens: 100, at: at('23:59:50.000', last), expires_at: iso(ms(at('23:59:50.000', last)) + ttlMs), lease_holder: 'gw-a' }]);
  assert.equal(b.carried_leases, [{ holder: 'gw-a', slots: 3, expires_at: iso(ms(turn) + 30_000) }]);
  assert.equal(b.carried_queue, [{ request_id: 'waits', holder: 'gw-a', at: at('23:59:55.000', last), expires_at: iso(ms(at('23:59:55.000', last)) + entryTtl) }]);
  assert.equal(b.recent_starts, [ms(at('23:59:50.000', last))]);
});
balance('carried holds keep their own day: one carried in from two days back is carried on with it', () => {
  const older = { ...carriedHold, request_id: 'older', day: '2026-11-22', at: at('23:59:00.000', '2026-11-22'), expires_at: at('01:00:00.000') };
  const events = [prevOpened({ carried_holds: [older] }), reserved({ id: 'mine', now: before('23:00:00.000') }), prevClosed];
  const b = balanceAfter(events);
  assert.equal(b.carried_holds.map((h) => [h.request_id, h.day]), [['older', '2026-11-22'], ['mine', prev]]);
});
balance('leases that lapsed by the time the balance is read are dropped; standing ones are carried as they stand', () => {
  const events = [
    prevOpened(),
    SlotsLeased({ holder: 'gw-lapsed', slots: 4, expires_at: before('23:59:59.000'), at: before('23:59:49.000') }),
    SlotsLeased({ holder: 'gw-standing', slots: 2, expires_at: iso(ms(midnight) + 5_000), at: before('23:59:55.000') }),
    SlotsLeased({ holder: 'gw-shrunk', slots: 0, expires_at: iso(ms(midnight) + 5_000), at: before('23:59:55.000') }),
    prevClosed,
  ];
  assert.equal(balanceAfter(events).carried_leases, [{ holder: 'gw-standing', slots: 2, expires_at: iso(ms(midnight) + 5_000) }]);
});
balance('only the request starts of the last minute are carried (the rolling rate limit), oldest first', () => {
  const events = [
    prevOpened({ recent_starts: [ms(before('00:00:00.000')) - 10_000] }),
    reserved({ id: 'a', now: before('23:58:59.999') }),
    reserved({ id: 'b', now: before('23:59:00.001') }),
    reserved({ id: 'c', now: before('23:59:59.000') }),
    prevClosed,
  ];
  assert.equal(balanceAfter(events).recent_starts, [ms(before('23:59:00.001')), ms(before('23:59:59.000'))]);
});
balance('queue entries standing at midnight are carried; lapsed, reserved and left ones are not', () => {
  const events = [
    prevOpened(),
    queued('lapsed', { holder: 'gw-dead', now: before('23:59:00.000') }),
    queued('reserved', { now: before('23:59:50.000') }),
    queued('left', { now: before('23:59:50.000') }),
    queued('waits', { holder: 'gw-b', now: before('23:59:50.000') }),
    reserved({ id: 'reserved', now: before('23:59:55.000') }),
    QueueLeft({ request_id: 'left', at: before('23:59:56.000') }),
    prevClosed,
  ];
  assert.equal(balanceAfter(events).carried_queue, [{ request_id: 'waits', holder: 'gw-b', at: before('23:59:50.000'), expires_at: iso(ms(before('23:59:50.000')) + entryTtl) }]);
});
balance.run();

// ---------------------------------------------------------------------------------------------

const storage = suite('meter decider: events as stored');
/** A day that produces every event type, decided command after command. */
const dayOfCommands: MeterCommand[] = [
  { type: 'OpenMeter', opening: opening({ month_input_tokens: 7, month_output_tokens: 9, carried_holds: [carriedHold], recent_starts: [t - 70_000, t - 30_000] }), now: at('00:00:00.000') },
  { type: 'ReleaseCarried', requestId: 'late', day: '2026-11-23', inputTokens: 10, outputTokens: 12, now: at('00:00:03.000') },
  reserve({ id: 'a', budget: { monthly_token_budget: 500 } }),
  reserve({ id: 'b', choices: 3, budget: { monthly_token_budget: 500, daily_token_budget: 300 } }),
  { type: 'Renew', requestId: 'b', expiresAt: at('12:20:00.000'), now: at('12:05:00.000') },
  // a's client left: billed what was generated, having taken fewer.
  { ...settle('a', 10, 55), disconnected: true, basis: 'relayed_frames', generatedOutputTokens: 55, relayedOutputTokens: 41 },
  { type: 'Expire', requestId: 'b', now: at('12:20:00.000') },
  // b's process was alive after all: its settlement comes late and is recorded beside the expiry, charging nothing.
  settle('b', 10, 7, at('12:20:30.000')),
  // e takes a slot lease and settles inside it (nothing used but its prompt); c renews the lease in its second half.
  reserve({ id: 'e', budget: { monthly_token_budget: 500 }, lease: { holder: 'gw-a', ttlMs: 10_000 } }),
  { ...settle('e', 10, 0, at('12:00:01.000')), lease: { holder: 'gw-a', waiting: 0 } },
  reserve({ id: 'c', budget: { monthly_token_budget: 500 }, lease: { holder: 'gw-a', ttlMs: 10_000 }, now: at('12:00:06.000') }),
  { type: 'RecordRejection', facts: facts('d'), code: 'rate_limited', status: 429, inputTokens: 3, latencyMs: 0.2, refusedBy: 'per_minute', retryAfterSeconds: 2, now: noon },
  // q1 and q2 wait for a slot; both are renewed, q2 gives up.
  { type: 'Queue', requestId: 'q1', holder: 'gw-a', maxQueued: 64, ttlMs: 30_000, now: at('12:00:07.000') },
  { type: 'Queue', requestId: 'q2', holder: 'gw-a', maxQueued: 64, ttlMs: 30_000, now: at('12:00:07.000') },
  { type: 'RenewQueued', holder: 'gw-a', requestIds: ['q1', 'q2'], ttlMs: 30_000, now: at('12:00:25.000') },
  { type: 'LeaveQueue', requestId: 'q2', now: at('12:00:26.000') },
  { type: 'CloseMeter', nextDay: '2026-11-25', now: at('00:00:00.050', '2026-11-25') },
  // c still runs at the close: it settles on the closed day, which says the next day carried it.
  { ...settle('c', 10, 4, at('00:00:02.000', '2026-11-25')), lease: { holder: 'gw-a', waiting: 0 } },
];
function foldGiven(events: readonly MeterEvent[]): MeterState {
  return foldEvents(meterDecider, meterDecider.initialState(), events);
}
function run(commands: readonly MeterCommand[]): { events: MeterEvent[]; state: MeterState } {
  let state = meterDecider.initialState();
  const events: MeterEvent[] = [];
  for (const command of commands) {
    const decided = decisionEvents(meterDecider.decide(command, state));
    if (isRejection(decided)) assert.unreachable(`${command.type} rejected: ${decided.message}`);
    else {
      events.push(...decided);
      state = foldEvents(meterDecider, state, decided);
    }
  }
  return { events, state };
}
storage('every event the decider produces passes the meter catalogue', () => {
  const { events } = run(dayOfCommands);
  assert.equal([...new Set(events.map((e) => e.type))].sort(), [...meterEvents.types].sort());
  for (const event of events) meterEvents.check(event);
});
storage('events stored as JSON and parsed back evolve to the same state', () => {
  const { events, state } = run(dayOfCommands);
  const reloaded = events.map((e) => meterEvents.parse(JSON.parse(JSON.stringify({ type: e.type, data: e.data, metadata: { schema_version: meterEvents.versionOf(e.type) } }))));
  assert.equal(foldEvents(meterDecider, meterDecider.initialState(), reloaded), state);
  // And the figures are the ones the rules give: 7 + 10 (carried) + 10 (a) + 10 (b, expired) + 10 (e) + 10 (c) input; b clamped by the day to 60 × 3, all charged on expiry.
  assert.equal([state.monthInput, state.monthOutput], [57, 9 + 12 + 55 + 60 * 3 + 4]);
  assert.equal(state.leases, { 'gw-a': { slots: 1, expiresAt: at('12:00:16.000') } });
  assert.is(state.holds.size, 0);
});
storage.run();
