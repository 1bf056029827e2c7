/**
 * The meter decider on a closed day: a hold still open at the close ends there (settled or expired)
 * with CarriedHoldEnded beside it, the fact the carried-holds workflow releases the next day's copy by.
 * On an open day nothing is added.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { meterDayAfterRefusal, meterDecider } from '../../deciders/meter.ts';
import { BudgetReserved, CarriedHoldEnded, dayAfter, MeterClosed, MeterOpened, ReservationExpired, UsageSettled, type RequestFactsData } from '../../events/meter.ts';
import { deciderSpecification } from '../support/decider-specification.ts';

const it = suite('meter decider: holds ending on a closed day');
const spec = deciderSpecification(meterDecider);
const day = '2026-11-24';
const next = '2026-11-25';
const facts: RequestFactsData = { request_id: 'x', key_prefix: 'k', email: 'ada@example.com', client_ip: null, endpoint: '/v1/completions', model: 'm', user: null, workload: null };
const opened = MeterOpened({ key_id: 'k', day, month_input_tokens: 0, month_output_tokens: 0, carried_from: null, carried_holds: [], carried_leases: [], carried_queue: [], recent_starts: [], at: `${day}T00:00:00.000Z` });
const reserved = BudgetReserved({
  ...facts,
  input_tokens: 5,
  output_tokens: 100,
  max_tokens_requested: 100,
  max_tokens_applied: 100,
  choices: 1,
  clamped_by: null,
  at: `${day}T23:59:50.000Z`,
  expires_at: `${next}T00:00:50.000Z`,
  lease_holder: null,
  budgets: { monthly_token_budget: null, daily_token_budget: null, monthly_input_token_budget: null, monthly_output_token_budget: null },
  limits: { max_active: 16, per_minute: 600, max_queued: null },
});
const closed = MeterClosed({ day, next_day: next, at: `${next}T00:00:01.000Z` });
const settle = { type: 'Settle' as const, facts, inputTokens: 5, outputTokens: 9, status: 200, latencyMs: 3, gpuSeconds: 0.5, costMicros: 250_000, pricePerGpuSecondMicros: 500_000, basis: 'engine_usage' as const, disconnected: false, now: `${next}T00:00:05.000Z` };
const settled = UsageSettled({ input_tokens: 5, output_tokens: 9, status: 200, latency_ms: 3, gpu_seconds: 0.5, disconnected: false, at: settle.now, cost_micros: 250_000, price_per_gpu_second_micros: 500_000, basis: 'engine_usage', generated_output_tokens: null, relayed_output_tokens: null, ...facts });

it('a settlement on a closed day says the hold it ends was carried', () => {
  spec.given([opened, reserved, closed]).when(settle).then([settled, CarriedHoldEnded({ request_id: 'x', day, input_tokens: 5, output_tokens: 9, at: settle.now })]);
});

it('an expiry on a closed day says so too, with the whole hold it charged', () => {
  const now = `${next}T00:01:00.000Z`;
  spec
    .given([opened, reserved, closed])
    .when({ type: 'Expire', requestId: 'x', now })
    .then([ReservationExpired({ request_id: 'x', input_tokens: 5, output_tokens: 100, at: now }), CarriedHoldEnded({ request_id: 'x', day, input_tokens: 5, output_tokens: 100, at: now })]);
});

it('a settlement on an open day adds nothing', () => {
  spec.given([opened, reserved]).when(settle).then([settled]);
});

it('a settlement sent again after the hold ended appends nothing, on a closed day too', () => {
  spec.given([opened, reserved, closed, settled, CarriedHoldEnded({ request_id: 'x', day, input_tokens: 5, output_tokens: 9, at: settle.now })]).when(settle).thenNothing();
});

it('a command refused on a closed day goes to the next day, one refused on a day not opened to the day before; other refusals are final', () => {
  const reserve = { type: 'Reserve' as const, facts: { ...facts, request_id: 'y' }, inputTokens: 1, maxTokens: 1, maxTokensRequested: 1, choices: 1, budgets: { monthly_token_budget: null, daily_token_budget: null, monthly_input_token_budget: null, monthly_output_token_budget: null, monthly_harvest_jobs: null }, keyStatus: 'active' as const, limits: { maxActive: 16, perMinute: 600 }, ttlMs: 60_000, now: settle.now };
  const onClosed = spec.given([opened, closed]).when(reserve).thenRejects('meter_closed');
  assert.is(meterDayAfterRefusal(onClosed, day), next);
  const notOpened = spec.given([]).when(reserve).thenRejects('meter_not_opened');
  assert.is(meterDayAfterRefusal(notOpened, next), day);
  assert.is(meterDayAfterRefusal({ rejected: 'budget_exceeded', message: 'spent' }, day), null);
  assert.is(dayAfter('2026-12-31'), '2027-01-01');
  assert.is(dayAfter('2028-03-01', -1), '2028-02-29');
});

it.run();
