/**
 * How a hold ends: Settle with the engine's real usage (or a late one, after its expiry), Expire once
 * its request died, ReleaseCarried on the day that carried it; and RecordRejection of a refused request.
 */
import { CarriedHoldEnded, CarriedHoldReleased, LateUsageRecorded, ReservationExpired, RequestRejected, UsageSettled } from '../events/meter.ts';
import { leaseLapsed, shrinkLease } from './meter-slots.ts';
import type { MeterCommand, MeterState } from './meter-state.ts';

export function settle(command: Extract<MeterCommand, { type: 'Settle' }>, state: MeterState) {
  const hold = state.holds.get(command.facts.request_id);
  if (!hold || hold.day !== state.day) {
    // A request that outlived its hold: its real usage is recorded next to what the expiry charged, once.
    if (!hold && state.expired.includes(command.facts.request_id)) return LateUsageRecorded(settlementFacts(command));
    // Settled already (a resend), or a hold carried from another day (settled there): nothing to charge here.
    return [];
  }
  const settled = UsageSettled(usageSettledFacts(command));
  const shrunk = command.lease && hold.lease === command.lease.holder ? shrinkLease(state, command.lease.holder, command.lease.waiting, command.now) : null;
  const ended = endedAfterClose(state, command.facts.request_id, command.inputTokens, command.outputTokens, command.now);
  return shrunk || ended ? [settled, ...(shrunk ? [shrunk] : []), ...(ended ? [ended] : [])] : settled;
}

export function expire(command: Extract<MeterCommand, { type: 'Expire' }>, state: MeterState) {
  const hold = state.holds.get(command.requestId);
  if (!hold || hold.day !== state.day) return [];
  const now = Date.parse(command.now);
  if (Date.parse(hold.expiresAt) > now && !leaseLapsed(state, hold, now)) return [];
  const expired = ReservationExpired({ request_id: command.requestId, input_tokens: hold.input, output_tokens: hold.output, at: command.now });
  const ended = endedAfterClose(state, command.requestId, hold.input, hold.output, command.now);
  return ended ? [expired, ended] : expired;
}

export function releaseCarried(command: Extract<MeterCommand, { type: 'ReleaseCarried' }>, state: MeterState) {
  const hold = state.holds.get(command.requestId);
  if (!hold || hold.day !== command.day || hold.day === state.day) return [];
  return CarriedHoldReleased({ request_id: command.requestId, day: command.day, input_tokens: command.inputTokens, output_tokens: command.outputTokens, at: command.now });
}

export function recordRejection(command: Extract<MeterCommand, { type: 'RecordRejection' }>) {
  return RequestRejected({
    code: command.code,
    status: command.status,
    input_tokens: command.inputTokens,
    latency_ms: command.latencyMs,
    at: command.now,
    refused_by: command.refusedBy,
    retry_after_seconds: command.retryAfterSeconds,
    ...command.facts,
  });
}

/** What a settlement records: the engine's usage, the GPU time, its price and exact charge, the basis. */
function settlementFacts(command: Extract<MeterCommand, { type: 'Settle' }>) {
  // The facts spread last: V8 builds `{ ...a, x, y }` property by property, several times slower.
  return {
    input_tokens: command.inputTokens,
    output_tokens: command.outputTokens,
    status: command.status,
    latency_ms: command.latencyMs,
    gpu_seconds: command.gpuSeconds,
    disconnected: command.disconnected,
    at: command.now,
    cost_micros: command.costMicros,
    price_per_gpu_second_micros: command.pricePerGpuSecondMicros,
    basis: command.basis,
    ...command.facts,
  };
}

/** A settlement of an open hold: settlementFacts and, for a stream cut short, what was generated and what the client took. */
function usageSettledFacts(command: Extract<MeterCommand, { type: 'Settle' }>) {
  // Two properties added to the literal settlementFacts built: cheap, unlike a spread of it into another.
  const facts = settlementFacts(command) as ReturnType<typeof settlementFacts> & { generated_output_tokens: number | null; relayed_output_tokens: number | null };
  facts.generated_output_tokens = command.generatedOutputTokens ?? null;
  facts.relayed_output_tokens = command.relayedOutputTokens ?? null;
  return facts;
}

/**
 * A hold that ends on a closed day was open when the day closed, so the next day carried it: say so,
 * for the carried-holds workflow to release it there (and on any day carried on from there).
 */
function endedAfterClose(state: MeterState, requestId: string, input: number, output: number, now: string) {
  return state.closed ? CarriedHoldEnded({ request_id: requestId, day: state.day!, input_tokens: input, output_tokens: output, at: now }) : null;
}
