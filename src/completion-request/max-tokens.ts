// max_tokens as sent to the engine: the deadline's bound, the clamp header, and the cuts made after
// preparation (to a per-key budget, or a default to the context its engine reports).
import { checkContext } from './prompt-limits.ts';
import type { ClampReason, MaxTokensSource, PreparedCompletion } from './types.ts';

/** The contract's cap on an injected default max_tokens. */
export const DEFAULT_MAX_TOKENS_CAP = 32_000;

/**
 * Max tokens that finish inside the non-streaming window: one fourteenth of the window is kept for prompt
 * processing and queueing, so 14 minutes at 20 tokens/s gives the contract's "about 15,600".
 */
export function deadlineFeasibleTokens(requestWindowMs: number, tokensPerSecond: number): number {
  return Math.floor((requestWindowMs * tokensPerSecond * 13) / 14_000);
}

/** `requested=N,applied=M,reason=R,source=S`: the `X-Svc-Max-Tokens-Clamped` header. */
export function formatMaxTokensClamped(requested: number, applied: number, reason: ClampReason, source: MaxTokensSource): string {
  return `requested=${requested},applied=${applied},reason=${reason},source=${source}`;
}

/**
 * The same completion with max_tokens lowered to fit a per-key budget: engine body, work tokens and the
 * clamp header follow (`reason=budget`, or `deadline+budget` after a deadline cut). Never raises it.
 */
export function lowerMaxTokens(prepared: PreparedCompletion, maxTokens: number): PreparedCompletion {
  if (!Number.isInteger(maxTokens) || maxTokens < 1) throw new RangeError(`max_tokens must be a positive integer, got ${maxTokens}`);
  if (maxTokens >= prepared.maxTokens) return prepared;
  const reason: ClampReason = prepared.maxTokensClampReason === 'deadline' || prepared.maxTokensClampReason === 'deadline+budget' ? 'deadline+budget' : 'budget';
  return {
    ...prepared,
    engineBody: { ...prepared.engineBody, max_tokens: maxTokens },
    maxTokens,
    maxTokensClampReason: reason,
    maxTokensClamped: formatMaxTokensClamped(prepared.maxTokensRequested, maxTokens, reason, prepared.maxTokensSource),
    workTokens: prepared.promptTokens + prepared.promptCount * prepared.n * maxTokens,
  };
}

/** True when the default max_tokens was injected without knowing the model's context (`max_model_len` null): ask the engine. */
export function needsEngineContextLength(prepared: PreparedCompletion): boolean {
  return prepared.maxTokensSource === 'default' && prepared.model.capabilities.max_model_len === null;
}

/**
 * The contract's default is min(32,000, remaining model context); when the registry does not know the
 * context, the engine does (its /tokenize answer). This sizes an injected default to `engineMaxModelLen`:
 * lowered to the room the longest prompt leaves, never raised. A prompt that fills that context is 400
 * `context_length_exceeded`, as with a known `max_model_len`. A deadline cut keeps its header, now
 * naming the context-sized default as requested. Anything else is returned as it is.
 */
export function fitDefaultToContext(prepared: PreparedCompletion, engineMaxModelLen: number): PreparedCompletion {
  if (!needsEngineContextLength(prepared)) return prepared;
  const longest = Math.max(...prepared.promptTokenCounts);
  checkContext('prompt', String(longest), longest, null, engineMaxModelLen, prepared.model.id, ' (as its engine reports it)');
  const room = engineMaxModelLen - longest;
  if (room >= prepared.maxTokensRequested) return prepared;
  const maxTokens = Math.min(prepared.maxTokens, room);
  const clampReason = maxTokens < room ? prepared.maxTokensClampReason : null;
  return {
    ...prepared,
    engineBody: { ...prepared.engineBody, max_tokens: maxTokens },
    maxTokens,
    maxTokensRequested: room,
    maxTokensClampReason: clampReason,
    maxTokensClamped: clampReason ? formatMaxTokensClamped(room, maxTokens, clampReason, prepared.maxTokensSource) : null,
    workTokens: prepared.promptTokens + prepared.promptCount * prepared.n * maxTokens,
  };
}

/** The request window as the deadline_infeasible message says it. */
export function windowText(ms: number): string {
  if (ms % 60_000 === 0) return `${ms / 60_000}-minute`;
  if (ms % 1000 === 0) return `${ms / 1000}-second`;
  return `${ms} ms`;
}
