/**
 * An auditor recomputes a month of charges from the event log alone, after the configuration changed
 * (prices and budgets): a real Metering on a clock the test moves, the real billing basis, the real
 * projections. Settled requests with the engine's usage, a broken stream (relayed frames), a broken
 * body (whole hold), a rejection by a budget, and an expiry followed by a late settlement. Every
 * charge is recomputed from what its event recorded (GPU seconds × the price applied, in micro-units;
 * tokens per key per day) and matched against usage_ledger, daily_spend and `svc audit usage`.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomUUID } from 'node:crypto';
import pino from 'pino';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { Metering, refusalOf } from '../../src/metering/index.ts';
import { ApiError } from '../../src/errors/index.ts';
import { ProjectionRunner } from '../../src/processors/index.ts';
import { runAuditCommand } from '../../src/cli/audit.ts';
import type { EventStore } from '../../src/store/index.ts';
import { billingBasis, chargeMicros, type RelayedOutcome } from '../../deciders/billing.ts';
import { meterDecider } from '../../deciders/meter.ts';
import { keyDecider } from '../../deciders/key.ts';
import { keyStream } from '../../events/key.ts';
import { meterEvents, meterStream, type MeterEvent } from '../../events/meter.ts';
import { projections } from '../../projections/index.ts';
import { adaptersUnderTest } from '../store/adapters.ts';
import { admitRequest, unlimitedBudgets } from '../support/admit-request.ts';

const days = ['2025-03-10', '2025-03-11'];
const ttlMs = 60_000;

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore }>(`audit: a month recomputed from the log alone (${adapter.name})`);
  it.before(async (context) => {
    context.store = await adapter.open({ pollIntervalMs: 50 });
  });
  it.after(async (context) => {
    await context.store?.close();
    await adapter.cleanup();
  });

  it('prices and budgets changed afterwards: every charge recomputed from its events matches the tables and svc audit usage; a late settlement is in both', async ({ store }) => {
    const keyId = randomUUID().replaceAll('-', '').slice(0, 12);
    let now = new Date(`${days[0]}T09:00:00.000Z`);
    const handler = new CommandHandler({ store });
    const metering = new Metering({ handler, store, logger: pino({ level: 'silent' }), reservationTtlMs: ttlMs, dailySpendCap: null, now: () => now });
    // The configuration as it stood that month (it changes below): a price per GPU-second and the key's budgets.
    const config = { costPerSecond: 0.0123457, budgets: { monthly_token_budget: 2_000, daily_token_budget: 900 } };
    const issued = await handler.handle(keyStream(keyId), { type: 'IssueKey', keyId, secretSha256: '0'.repeat(64), email: `${keyId}@example.org`, userId: 'finance-test', budgets: { ...unlimitedBudgets, ...config.budgets }, now: now.toISOString() }, keyDecider);
    assert.ok(issued.accepted);
    const request = (maxTokens: number, user: string | null = null) => {
      const req = admitRequest(keyId, { budgets: { ...config.budgets }, maxTokens });
      return { ...req, facts: { ...req.facts, user } };
    };
    const served = async (maxTokens: number, relayed: RelayedOutcome | null, stream: boolean, seconds: number, user: string | null = null) => {
      const req = request(maxTokens, user);
      const admission = await metering.admit(req);
      await admission.durable;
      const billed = billingBasis(relayed, { stream, promptTokens: 5, promptCount: 1, n: 1, maxTokens: admission.maxTokens }, { seconds, costPerSecond: config.costPerSecond });
      const { basis, inputTokens, outputTokens, gpuSeconds, costMicros, pricePerGpuSecondMicros, disconnected, generatedOutputTokens, relayedOutputTokens } = billed;
      await metering.settle(admission, req.facts, { basis, inputTokens, outputTokens, gpuSeconds, costMicros, pricePerGpuSecondMicros, disconnected, generatedOutputTokens, relayedOutputTokens, status: 200, latencyMs: 3 });
      return req.facts.request_id;
    };

    // Day 1: the engine's usage, a broken stream (7 frames received, 5 taken by the client's socket), a broken body (the whole hold).
    await served(40, { usage: { prompt_tokens: 5, completion_tokens: 31 }, contentFrames: 0, completed: true }, false, 2.5, 'alice');
    const brokenStream = await served(40, { usage: null, contentFrames: 7, relayedFrames: 5, completed: false }, true, 0.7333333, 'bob');
    await served(30, { usage: null, contentFrames: 0, completed: false }, false, 1.1, '=HYPERLINK("x"),evil');
    // A request a budget refuses (the daily one is the tightest), recorded as the route records it.
    const refusedReq = request(100_000);
    refusedReq.inputTokens = 2_500;
    const refusal = (await metering.admit(refusedReq).then(
      () => assert.unreachable('the budget should refuse it'),
      (error: unknown) => error,
    )) as ApiError;
    assert.instance(refusal, ApiError);
    metering.recordRejection(keyId, refusedReq.facts, refusal.code, refusal.status, refusedReq.inputTokens, 0.5, refusalOf(refusal));

    // Day 2, a new price: a hold whose process fell behind is expired by the reaper, then its settlement comes.
    now = new Date(`${days[1]}T10:00:00.000Z`);
    config.costPerSecond = 0.02;
    await served(20, { usage: { prompt_tokens: 5, completion_tokens: 20 }, contentFrames: 0, completed: true }, false, 0.4, 'alice');
    const lateReq = request(50, 'bob');
    const late = await metering.admit(lateReq);
    await late.durable;
    now = new Date(now.getTime() + ttlMs + 1_000);
    const expired = await handler.handle(late.stream, { type: 'Expire', requestId: late.requestId, now: now.toISOString() }, meterDecider);
    assert.is(expired.accepted && expired.newEvents[0]?.type, 'ReservationExpired');
    const lateBilled = billingBasis({ usage: { prompt_tokens: 5, completion_tokens: 12 }, contentFrames: 0, completed: true }, { stream: false, promptTokens: 5, promptCount: 1, n: 1, maxTokens: 50 }, { seconds: 3.25, costPerSecond: config.costPerSecond });
    await metering.settle(late, lateReq.facts, { ...lateBilled, status: 200, latencyMs: 61_000 });
    await metering.stop();

    // The configuration changes afterwards: nothing below may read it.
    config.costPerSecond = 99;
    config.budgets = { monthly_token_budget: 1, daily_token_budget: 1 };

    const runner = new ProjectionRunner({ store, projections, pollIntervalMs: 50 });
    await runner.start();
    await runner.caughtUp();
    await runner.stop();

    // --- the auditor's side: the log alone ---------------------------------------------------
    const log: MeterEvent[][] = [];
    for (const day of days) log.push((await store.readStream(meterStream(keyId, day))).events.map((e) => meterEvents.parse(e)));
    const perDay = days.map(() => ({ input: 0, output: 0, costMicros: 0 }));
    const costOf = new Map<string, number>();
    log.forEach((events, d) => {
      for (const e of events) {
        if (e.type === 'UsageSettled' || e.type === 'LateUsageRecorded') {
          // The charge from the two numbers the settlement recorded, not from any price configured now.
          assert.ok(e.data.price_per_gpu_second_micros !== null && e.data.basis !== null);
          const recomputed = chargeMicros(e.data.gpu_seconds, e.data.price_per_gpu_second_micros!);
          assert.is(e.data.cost_micros, recomputed, `${e.type} ${e.data.request_id}`);
          assert.ok(Number.isInteger(e.data.cost_micros));
          perDay[d].costMicros += recomputed;
          costOf.set(e.data.request_id, recomputed);
        }
        // Tokens charged: settlements and expiries; a late settlement charges nothing more.
        if (e.type === 'UsageSettled' || e.type === 'ReservationExpired') {
          perDay[d].input += e.data.input_tokens;
          perDay[d].output += e.data.output_tokens;
        }
        if (e.type === 'BudgetReserved') {
          assert.equal(e.data.budgets, { monthly_token_budget: 2_000, daily_token_budget: 900, monthly_input_token_budget: null, monthly_output_token_budget: null });
          assert.equal(e.data.limits, { max_active: 16, per_minute: 600, max_queued: 64 });
        }
      }
    });
    const types = log.flat().map((e) => e.type);
    assert.equal(
      log.flat().flatMap((e) => (e.type === 'UsageSettled' || e.type === 'LateUsageRecorded' ? [[e.type, e.data.basis, e.data.price_per_gpu_second_micros]] : [])),
      [
        ['UsageSettled', 'engine_usage', 12_346],
        ['UsageSettled', 'relayed_frames', 12_346],
        ['UsageSettled', 'whole_hold', 12_346],
        ['UsageSettled', 'engine_usage', 20_000],
        ['LateUsageRecorded', 'engine_usage', 20_000],
      ],
    );
    assert.ok(types.indexOf('ReservationExpired') < types.indexOf('LateUsageRecorded'), 'the late settlement follows the expiry');
    const rejected = log.flat().find((e) => e.type === 'RequestRejected')!;
    assert.ok(rejected.type === 'RequestRejected');
    assert.equal([rejected.data.code, rejected.data.refused_by], ['budget_exceeded', 'daily_token_budget']);
    assert.is(rejected.data.retry_after_seconds, 15 * 3600, 'the seconds until the UTC day turns (09:00 -> midnight)');
    // Day 1: 5 + 31, 5 + 7 (relayed frames), 5 + 30 (whole hold); day 2: 5 + 20, and the expiry's whole hold 5 + 50.
    assert.equal(perDay.map((p) => [p.input, p.output]), [[15, 68], [10, 70]]);

    // --- the tables ---------------------------------------------------------------------------
    const { rows: ledger } = await store.query<Record<string, unknown>>(
      `SELECT request_id, outcome, input_tokens, output_tokens, cost_micros, cost::text AS cost, basis, price_per_gpu_second_micros, late_input_tokens, late_output_tokens, to_char(day, 'YYYY-MM-DD') AS day
       FROM usage_ledger WHERE key_id = $1 ORDER BY at`,
      [keyId],
    );
    for (const row of ledger) {
      if (row.outcome === 'rejected') continue;
      assert.is(Number(row.cost_micros), costOf.get(String(row.request_id)), `ledger cost of ${String(row.request_id)}`);
      assert.is(row.cost, (Number(row.cost_micros) / 1e6).toFixed(6));
    }
    const lateRow = ledger.find((r) => r.request_id === late.requestId)!;
    assert.equal(
      [lateRow.outcome, Number(lateRow.input_tokens), Number(lateRow.output_tokens), Number(lateRow.late_input_tokens), Number(lateRow.late_output_tokens), lateRow.basis],
      ['expired', 5, 50, 5, 12, 'engine_usage'],
      'the expiry charged the whole hold; the late settlement sits beside it',
    );
    for (const [d, day] of days.entries()) {
      const mine = ledger.filter((r) => r.day === day).reduce((sum, r) => sum + Number(r.cost_micros ?? 0), 0);
      assert.is(mine, perDay[d].costMicros, `usage_ledger's cost on ${day}`);
      const { rows: spend } = await store.query<{ cost_micros: string | number }>(`SELECT cost_micros FROM daily_spend WHERE day = $1::date`, [day]);
      const { rows: all } = await store.query<{ total: string | number }>(`SELECT coalesce(sum(cost_micros), 0)::bigint AS total FROM usage_ledger WHERE day = $1::date`, [day]);
      assert.is(Number(spend[0].cost_micros), Number(all[0].total), `daily_spend on ${day} is the ledger's sum, the late settlement included`);
      const { rows: usage } = await store.query<{ input_tokens: string | number; output_tokens: string | number }>(
        `SELECT input_tokens, output_tokens FROM key_usage WHERE key_id = $1 AND period_kind = 'day' AND period = $2`,
        [keyId, day],
      );
      assert.equal([Number(usage[0].input_tokens), Number(usage[0].output_tokens)], [perDay[d].input, perDay[d].output], `key_usage on ${day}`);
    }

    // --- svc audit usage agrees -----------------------------------------------------------------
    let out = '';
    const code = await runAuditCommand(['usage', '--key', keyId, '--month', '2025-03', '--json'], { store, stdout: { write: (t: string) => (out += t) }, stderr: { write: () => {} } });
    assert.is(code, 0, out);
    const report = JSON.parse(out) as { agree: boolean; periods: { period_kind: string; period: string; log: { input_tokens: number; output_tokens: number } }[] };
    assert.ok(report.agree);
    for (const [d, day] of days.entries()) {
      const period = report.periods.find((p) => p.period_kind === 'day' && p.period === day)!;
      assert.equal([period.log.input_tokens, period.log.output_tokens], [perDay[d].input, perDay[d].output]);
    }

    // --- svc audit usage: the month by default, the owner and budgets, tokens charged by expiry apart ----------
    const run = async (...args: string[]) => {
      const io = { out: '', err: '' };
      const code = await runAuditCommand(args, { store, now: () => new Date('2025-03-20T12:00:00Z'), stdout: { write: (t: string) => (io.out += t) }, stderr: { write: (t: string) => (io.err += t) } });
      return { code, ...io };
    };
    const usageText = await run('usage', '--key', keyId);
    assert.is(usageText.code, 0, usageText.out + usageText.err);
    assert.match(usageText.out, `key ${keyId}, 2025-03: owner ${keyId}@example.org (user finance-test), active`);
    assert.match(usageText.out, 'budgets now: monthly_token_budget 2000, daily_token_budget 900, monthly_input_token_budget unlimited, monthly_output_token_budget unlimited, monthly_harvest_jobs unlimited');
    assert.match(usageText.out, 'charged: settled 20 in / 88 out (4 requests); by expiry 5 in / 50 out (1 holds, the whole hold each); late settlements after an expiry (not charged again) 5 in / 12 out (1)');
    const unknown = await run('usage', '--key', 'ffffffffffff');
    assert.equal([unknown.code, /unknown key ffffffffffff/.test(unknown.err)], [2, true]);
    assert.equal((await run('statement', '--key', 'ffffffffffff')).code, 2);

    // --- svc audit statement: one line per request, totals = the projections' totals ------------------
    const json = await run('statement', '--key', keyId, '--month', '2025-03', '--format', 'json');
    assert.is(json.code, 0, json.err);
    const statement = JSON.parse(json.out) as { agree: boolean; lines: Record<string, unknown>[]; totals: Record<string, number | string> };
    assert.equal([statement.agree, statement.lines.length], [true, ledger.length]);
    assert.equal(statement.lines.map((l) => l.request_id).sort(), ledger.map((r) => r.request_id).sort());
    const { rows: monthUsage } = await store.query<{ input_tokens: string; output_tokens: string }>(
      `SELECT input_tokens, output_tokens FROM key_usage WHERE key_id = $1 AND period_kind = 'month' AND period = '2025-03'`,
      [keyId],
    );
    const { rows: spent } = await store.query<{ cost_micros: string; cost: string }>(`SELECT sum(cost_micros)::bigint AS cost_micros, sum(cost)::text AS cost FROM daily_spend WHERE day = ANY($1::date[])`, [days]);
    assert.equal(
      [statement.totals.input_tokens, statement.totals.output_tokens, statement.totals.cost_micros, statement.totals.cost],
      [Number(monthUsage[0].input_tokens), Number(monthUsage[0].output_tokens), Number(spent[0].cost_micros), spent[0].cost],
      'statement totals = key_usage (tokens) and daily_spend (cost)',
    );
    assert.equal([statement.totals.settled, statement.totals.expired, statement.totals.rejected], [4, 1, 1]);
    const broken = statement.lines.find((l) => l.request_id === brokenStream)!;
    assert.equal(
      [broken.basis, broken.disconnected, broken.output_tokens, broken.generated_output_tokens, broken.relayed_output_tokens],
      ['relayed_frames', true, 7, 7, 5],
      'a broken stream: billed what was generated, the frames the client took beside it',
    );
    assert.ok(statement.lines.filter((l) => l.request_id !== brokenStream).every((l) => l.generated_output_tokens === null && l.relayed_output_tokens === null), 'null on every other line');
    const lateLine = statement.lines.find((l) => l.request_id === late.requestId)!;
    assert.equal([lateLine.outcome, lateLine.output_tokens, lateLine.late_output_tokens, lateLine.cost_micros], ['expired', 50, 12, costOf.get(late.requestId)]);

    const csv = await run('statement', '--key', keyId, '--month', '2025-03');
    assert.is(csv.code, 0, csv.err);
    const rows = csv.out.trimEnd().split('\r\n');
    assert.is(rows[0], 'request_id,at,email,user_tag,model,outcome,status,code,input_tokens,output_tokens,basis,gpu_seconds,price_per_gpu_second_micros,cost,disconnected,generated_output_tokens,relayed_output_tokens,late_input_tokens,late_output_tokens');
    assert.is(rows.length, ledger.length + 2, 'a header, one line per request, the totals');
    assert.match(rows.at(-1)!, `TOTAL,,,,,6 requests,,,25,138,,,,${statement.totals.cost}`);
    assert.ok(csv.out.includes(`"'=HYPERLINK(""x""),evil"`), 'a user tag that a spreadsheet would run is quoted and defused');

    const users = await run('statement', '--key', keyId, '--month', '2025-03', '--by', 'user', '--format', 'json');
    assert.is(users.code, 0, users.err);
    const rollup = (JSON.parse(users.out) as { by_user: { user_tag: string | null; requests: number; cost_micros: number }[] }).by_user;
    assert.equal(Object.fromEntries(rollup.map((u) => [String(u.user_tag), u.requests])), { alice: 2, bob: 2, '=HYPERLINK("x"),evil': 1, null: 1 });
    assert.is(rollup.reduce((sum, u) => sum + u.cost_micros, 0), statement.totals.cost_micros);
    const usersCsv = await run('statement', '--key', keyId, '--month', '2025-03', '--by', 'user');
    assert.match(usersCsv.out, /^user_tag,requests,settled,expired,rejected,input_tokens,output_tokens,cost\r\n/);
    assert.match(usersCsv.out, `TOTAL,6,4,1,1,25,138,${statement.totals.cost}\r\n`);

    // --- a ledger row that disagrees with the log: exit 1, the request and field named --------------------
    await store.query(`UPDATE usage_ledger SET cost_micros = cost_micros + 1 WHERE request_id = $1`, [brokenStream]);
    const differ = await run('statement', '--key', keyId, '--month', '2025-03');
    assert.is(differ.code, 1);
    assert.match(differ.err, `${brokenStream}: cost_micros statement`);
    await store.query(`UPDATE usage_ledger SET cost_micros = cost_micros - 1 WHERE request_id = $1`, [brokenStream]);
    await store.query(`UPDATE usage_ledger SET relayed_output_tokens = 7 WHERE request_id = $1`, [brokenStream]);
    const relayedDiffers = await run('statement', '--key', keyId, '--month', '2025-03');
    assert.is(relayedDiffers.code, 1);
    assert.match(relayedDiffers.err, `${brokenStream}: relayed_output_tokens statement 5, usage_ledger 7`);
    await store.query(`UPDATE usage_ledger SET relayed_output_tokens = 5 WHERE request_id = $1`, [brokenStream]);
    await store.query(`DELETE FROM usage_ledger WHERE request_id = $1`, [late.requestId]);
    const missing = await run('statement', '--key', keyId, '--month', '2025-03', '--format', 'json');
    assert.is(missing.code, 1);
    assert.equal(JSON.parse(missing.out).differences, [`${late.requestId}: on the statement, not in usage_ledger`]);
  });

  it.run();
}
