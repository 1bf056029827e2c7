/**
 * 9. Settle: a reserved request is billed once its response is over, from the engine's usage when it
 * came through, else from what the relay saw (billingBasis); the reservation's rest is released.
 */
import { billingBasis } from '../../../deciders/billing.ts';
import type { PreparedCompletion } from '../../completion-request/index.ts';
import type { RelayedUsage } from '../usage-relay.ts';
import type { ServedTokens } from '../request-log.ts';
import type { CompletionCall } from './call.ts';

export function settle(call: CompletionCall, usage: RelayedUsage | null, status: number): void {
  const { admission, completion } = call;
  const metering = call.options.metering;
  if (!admission || !metering) return;
  const billed = billingBasis(usage, completion, { seconds: (performance.now() - call.gpuStarted) / 1000, costPerSecond: completion.model.cost_per_second });
  void metering.meter.settle(admission, call.requestFacts, {
    inputTokens: billed.inputTokens,
    outputTokens: billed.outputTokens,
    status,
    latencyMs: performance.now() - call.started,
    gpuSeconds: billed.gpuSeconds,
    costMicros: billed.costMicros,
    pricePerGpuSecondMicros: billed.pricePerGpuSecondMicros,
    basis: billed.basis,
    disconnected: billed.disconnected,
    generatedOutputTokens: billed.generatedOutputTokens,
    relayedOutputTokens: billed.relayedOutputTokens,
  });
}

/** What the relay saw of a body that did not come through whole (nothing yet, or cut short). */
export const cutShort = (): RelayedUsage => ({ usage: null, contentFrames: 0, relayedFrames: 0, completed: false });

/** A request's tokens for its log line: the engine's usage when it came through, else what the relay saw. */
export function tokensSeen(relayed: RelayedUsage | null, request: PreparedCompletion): ServedTokens {
  if (relayed?.usage) return { prompt_tokens: relayed.usage.prompt_tokens, completion_tokens: relayed.usage.completion_tokens };
  if (relayed === null) return { prompt_tokens: request.promptTokens, completion_tokens: 0 };
  // A stream relays one content frame per token per choice; a body that broke off cannot say.
  return { prompt_tokens: request.promptTokens, completion_tokens: request.stream ? relayed.contentFrames : null };
}
