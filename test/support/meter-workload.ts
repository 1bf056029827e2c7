/**
 * A mixed metering workload written through the real deciders (CommandHandler + deciders/key.ts +
 * deciders/meter.ts on a real store): keys issued, meter days opened with the month's balance,
 * reservations settled, expired, rejected, one carried over midnight at a month's turn (reserved
 * 2026-11-30 23:59:30, settled 2026-12-01 on its own stream, released on the next day's), one left open.
 */
import * as assert from 'uvu/assert';
import { randomBytes } from 'node:crypto';
import { CommandHandler } from '../../src/command-handler/index.ts';
import type { EventStore } from '../../src/store/index.ts';
import { keyDecider } from '../../deciders/key.ts';
import { meterDecider, type MeterCommand, type MeterState } from '../../deciders/meter.ts';
import { keyStream } from '../../events/key.ts';
import { meterStream, type MeterOpening, type RequestFactsData } from '../../events/meter.ts';
import { unlimitedBudgets } from './admit-request.ts';


export const newKeyId = (): string => randomBytes(6).toString('hex');

/** Drives one key's meter through the command handler, the way the gateway does. */
export class MeterDriver {
  readonly handler: CommandHandler;
  constructor(
    readonly store: EventStore,
    readonly keyId: string,
    readonly email = `${keyId}@example.org`,
  ) {
    this.handler = new CommandHandler({ store });
  }

  async issue(now: string): Promise<void> {
    const outcome = await this.handler.handle(keyStream(this.keyId), { type: 'IssueKey', keyId: this.keyId, secretSha256: '0'.repeat(64), email: this.email, userId: 'u1', budgets: unlimitedBudgets, now }, keyDecider);
    assert.ok(outcome.accepted);
  }

  async state(day: string): Promise<MeterState> {
    return (await this.handler.load(meterStream(this.keyId, day), meterDecider)).state;
  }

  /** Opens `day` with the balance of `from` (the previous meter day, same month) and its open holds. */
  async open(day: string, now: string, from: string | null = null): Promise<void> {
    let opening: MeterOpening = { key_id: this.keyId, day, month_input_tokens: 0, month_output_tokens: 0, carried_from: null, carried_holds: [], carried_leases: [], recent_starts: [] };
    if (from) {
      const prev = await this.state(from);
      const sameMonth = from.slice(0, 7) === day.slice(0, 7);
      opening = {
        ...opening,
        month_input_tokens: sameMonth ? prev.monthInput : 0,
        month_output_tokens: sameMonth ? prev.monthOutput : 0,
        carried_from: sameMonth ? from : null,
        carried_holds: [...prev.holds].map(([request_id, h]) => ({ request_id, day: h.day, input_tokens: h.input, output_tokens: h.output, at: h.at, expires_at: h.expiresAt, lease_holder: h.lease })),
        recent_starts: prev.starts.toArray(),
      };
    }
    await this.#run(day, { type: 'OpenMeter', opening, now });
  }

  facts(requestId: string): RequestFactsData {
    return { request_id: requestId, key_prefix: this.keyId, email: this.email, client_ip: '127.0.0.1', endpoint: '/v1/completions', model: 'ref-small', user: 'analyst-7', workload: 'batch' };
  }

  async reserve(day: string, requestId: string, inputTokens: number, maxTokens: number, now: string, ttlMs = 60_000): Promise<void> {
    await this.#run(day, {
      type: 'Reserve',
      facts: this.facts(requestId),
      inputTokens,
      maxTokens,
      maxTokensRequested: maxTokens,
      choices: 1,
      budgets: unlimitedBudgets,
      keyStatus: 'active',
      limits: { maxActive: 16, perMinute: 600 },
      ttlMs,
      now,
    });
  }

  /** `cost` in currency units (recorded in micro-units); no price is recorded. */
  async settle(day: string, requestId: string, inputTokens: number, outputTokens: number, now: string, gpuSeconds = 0.25, cost = 0.5): Promise<void> {
    const priced = { costMicros: Math.round(cost * 1e6), pricePerGpuSecondMicros: null, basis: 'engine_usage' as const };
    await this.#run(day, { type: 'Settle', facts: this.facts(requestId), inputTokens, outputTokens, status: 200, latencyMs: 12.5, gpuSeconds, ...priced, disconnected: false, now });
  }

  async expire(day: string, requestId: string, now: string): Promise<void> {
    await this.#run(day, { type: 'Expire', requestId, now });
  }

  async renew(day: string, requestId: string, expiresAt: string, now: string): Promise<void> {
    await this.#run(day, { type: 'Renew', requestId, expiresAt, now });
  }

  async releaseCarried(day: string, requestId: string, heldDay: string, inputTokens: number, outputTokens: number, now: string): Promise<void> {
    await this.#run(day, { type: 'ReleaseCarried', requestId, day: heldDay, inputTokens, outputTokens, now });
  }

  async reject(day: string, requestId: string, code: string, status: number, inputTokens: number, now: string): Promise<void> {
    await this.#run(day, { type: 'RecordRejection', facts: this.facts(requestId), code, status, inputTokens, latencyMs: 0.4, refusedBy: null, retryAfterSeconds: null, now });
  }

  async #run(day: string, command: MeterCommand): Promise<void> {
    const outcome = await this.handler.handle(meterStream(this.keyId, day), command, meterDecider);
    if (!outcome.accepted) return assert.unreachable(`${command.type} on ${day} was rejected: ${outcome.rejection.message}`);
    assert.ok(outcome.newEvents.length > 0, `${command.type} on ${day} decided nothing`);
  }
}

export interface Workload {
  a: MeterDriver;
  b: MeterDriver;
}

/** Key A over 2026-11-29, 11-30 and 12-01; key B on 11-30. Phase 1 and 2 can run apart (catch-up, then live). */
export async function mixedWorkloadPhase1(store: EventStore, keys = { a: newKeyId(), b: newKeyId() }): Promise<Workload> {
  const a = new MeterDriver(store, keys.a);
  const b = new MeterDriver(store, keys.b);
  await a.issue('2026-11-28T09:00:00.000Z');
  await b.issue('2026-11-28T09:00:01.000Z');
  // 2026-11-29: settled, expired, rejected
  await a.open('2026-11-29', '2026-11-29T10:00:00.000Z');
  await a.reserve('2026-11-29', `${a.keyId}-r1`, 10, 20, '2026-11-29T10:00:00.000Z');
  await a.settle('2026-11-29', `${a.keyId}-r1`, 10, 15, '2026-11-29T10:00:01.000Z', 0.5, 1.25);
  await a.reserve('2026-11-29', `${a.keyId}-r2`, 5, 10, '2026-11-29T10:01:00.000Z');
  await a.reject('2026-11-29', `${a.keyId}-r3`, 'budget_exceeded', 429, 7, '2026-11-29T10:02:00.000Z');
  await a.expire('2026-11-29', `${a.keyId}-r2`, '2026-11-29T10:03:00.000Z');
  // r2's process was alive after all: its settlement comes after the expiry (LateUsageRecorded).
  await a.settle('2026-11-29', `${a.keyId}-r2`, 5, 4, '2026-11-29T10:03:30.000Z', 0.75, 0.5);
  // 2026-11-30: a settled request, and one reserved seconds before midnight
  await a.open('2026-11-30', '2026-11-30T12:00:00.000Z', '2026-11-29');
  await a.reserve('2026-11-30', `${a.keyId}-r7`, 2, 8, '2026-11-30T12:00:00.000Z');
  await a.settle('2026-11-30', `${a.keyId}-r7`, 2, 6, '2026-11-30T12:00:02.000Z', 0.125, 0.25);
  await a.reserve('2026-11-30', `${a.keyId}-r4`, 8, 30, '2026-11-30T23:59:30.000Z');
  await b.open('2026-11-30', '2026-11-30T08:00:00.000Z');
  await b.reserve('2026-11-30', `${b.keyId}-r8`, 100, 50, '2026-11-30T08:00:00.000Z');
  await b.settle('2026-11-30', `${b.keyId}-r8`, 100, 50, '2026-11-30T08:00:03.000Z', 1, 2);
  await b.reject('2026-11-30', `${b.keyId}-r9`, 'rate_limited', 429, 3, '2026-11-30T08:00:04.000Z');
  return { a, b };
}

export async function mixedWorkloadPhase2({ a }: Workload): Promise<void> {
  // 2026-12-01: a new month; r4 is carried in, settled on its own (11-30) stream, released here
  await a.open('2026-12-01', '2026-12-01T00:00:01.000Z', '2026-11-30');
  await a.reserve('2026-12-01', `${a.keyId}-r5`, 3, 4, '2026-12-01T00:00:05.000Z');
  await a.settle('2026-12-01', `${a.keyId}-r5`, 3, 4, '2026-12-01T00:00:06.000Z', 0.0625, 0.125);
  await a.settle('2026-11-30', `${a.keyId}-r4`, 8, 12, '2026-12-01T00:00:10.000Z', 0.75, 1.5);
  await a.releaseCarried('2026-12-01', `${a.keyId}-r4`, '2026-11-30', 8, 12, '2026-12-01T00:00:11.000Z');
  await a.reserve('2026-12-01', `${a.keyId}-r6`, 4, 16, '2026-12-01T00:01:00.000Z');
  await a.renew('2026-12-01', `${a.keyId}-r6`, '2026-12-01T00:03:00.000Z', '2026-12-01T00:01:30.000Z');
}

export async function mixedWorkload(store: EventStore): Promise<Workload> {
  const workload = await mixedWorkloadPhase1(store);
  await mixedWorkloadPhase2(workload);
  return workload;
}
