/**
 * What a finished request is billed: its tokens from the best evidence there is, and its GPU time at
 * the model's price. Pure: the route passes in what the relay saw, the request's shape and the clock.
 */

import type { BillingBasisName } from '../events/meter.ts';

/**
 * Where a settlement's token counts come from: `engine_usage` (the engine's own usage object, a body
 * or usage frame that came through whole), `relayed_frames` (a stream that broke off: the prompt plus
 * one output token per content frame the gateway received from the engine and passed on), `whole_hold` (a non-streaming body that broke off: it
 * cannot say how far generation got), `not_run` (the engine never answered: no tokens).
 */
export type { BillingBasisName };

/** An amount of the configured currency unit in integer micro-units (the configuration's prices and cap are decimals). */
export const toMicros = (amount: number): number => Math.round(amount * 1e6);

/**
 * The exact charge of `gpuSeconds` at `priceMicros` per GPU-second: rounded once, half up, to a
 * micro-unit. An auditor recomputes it from the two numbers a settlement records.
 */
export const chargeMicros = (gpuSeconds: number, priceMicros: number): number => Math.floor(gpuSeconds * priceMicros + 0.5);

/** What the usage relay learnt on the way through (src/api/usage-relay.ts, RelayedUsage). */
export interface RelayedOutcome {
  readonly usage: { readonly prompt_tokens: number; readonly completion_tokens: number } | null;
  readonly contentFrames: number;
  /** Content frames the client's socket took (a stream's write callbacks that came back without an error; absent: none). */
  readonly relayedFrames?: number;
  readonly completed: boolean;
}

/** The request as it was sent to the engine (max_tokens after any clamp). */
export interface BilledRequest {
  readonly stream: boolean;
  readonly promptTokens: number;
  readonly promptCount: number;
  readonly n: number;
  readonly maxTokens: number;
}

export interface BillingBasis {
  readonly basis: BillingBasisName;
  readonly inputTokens: number;
  readonly outputTokens: number;
  /** True when the client left before the end (billed for what was generated). */
  readonly disconnected: boolean;
  readonly gpuSeconds: number;
  /** The model's price per GPU-second applied, in micro-units. */
  readonly pricePerGpuSecondMicros: number;
  /** gpuSeconds × the price, in micro-units (chargeMicros). */
  readonly costMicros: number;
  /**
   * A stream cut short: output tokens generated as far as the gateway knows (the engine's usage when its
   * frame came, else the content frames received), and the content frames the client's socket took.
   * Null for a stream that ended normally, a non-streaming request and one that never ran.
   */
  readonly generatedOutputTokens: number | null;
  readonly relayedOutputTokens: number | null;
}

/**
 * The billing basis of a request: `relayed` is null when no engine response came through at all
 * (the engine failed before answering, or the request was refused on its way), else what the relay saw.
 * GPU seconds are billed on every basis: the backend was held for them either way.
 */
export function billingBasis(relayed: RelayedOutcome | null, request: BilledRequest, gpu: { seconds: number; costPerSecond: number }): BillingBasis {
  const price = toMicros(gpu.costPerSecond);
  const whole = { gpuSeconds: gpu.seconds, pricePerGpuSecondMicros: price, costMicros: chargeMicros(gpu.seconds, price), generatedOutputTokens: null, relayedOutputTokens: null };
  if (relayed === null) return { basis: 'not_run', inputTokens: 0, outputTokens: 0, disconnected: false, ...whole };
  const disconnected = !relayed.completed;
  const generated = relayed.usage ? relayed.usage.completion_tokens : relayed.contentFrames;
  const priced = request.stream && disconnected ? { ...whole, generatedOutputTokens: generated, relayedOutputTokens: relayed.relayedFrames ?? 0 } : whole;
  if (relayed.usage) {
    return { basis: 'engine_usage', inputTokens: relayed.usage.prompt_tokens, outputTokens: relayed.usage.completion_tokens, disconnected, ...priced };
  }
  if (request.stream) return { basis: 'relayed_frames', inputTokens: request.promptTokens, outputTokens: relayed.contentFrames, disconnected, ...priced };
  return { basis: 'whole_hold', inputTokens: request.promptTokens, outputTokens: request.promptCount * request.n * request.maxTokens, disconnected, ...priced };
}
