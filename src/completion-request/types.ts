import type { ModelConfig } from '../config/index.ts';
import type { ModelRegistry } from '../registry/index.ts';
import type { TokenizerPool } from '../tokenizer/index.ts';

export interface CompletionContext {
  registry: ModelRegistry;
  /** Where long text prompts are tokenized (prepareValidCompletionAsync); without one, everything is tokenized in place. */
  tokenizers?: TokenizerPool;
  /** The non-streaming request window (the contract's 14 minutes). */
  requestWindowMs: number;
  /** Generation speed the deadline feasibility check assumes (the contract's 20 tokens/s). */
  deadlineTokensPerSecond: number;
}

export type MaxTokensSource = 'client' | 'default';
export type ClampReason = 'deadline' | 'budget' | 'deadline+budget';

export interface PreparedCompletion {
  model: ModelConfig;
  stream: boolean;
  /** Ready to JSON.stringify and send to the engine's POST /v1/completions. */
  engineBody: Record<string, unknown>;
  /** A stream whose client asked for the usage frame (the engine is always asked for it). */
  clientWantsUsage: boolean;
  /** 1 for a single string or token-id list; otherwise the batch length. */
  promptCount: number;
  /** Tokens of each prompt as the engine will bill them (`add_special_tokens` applied). */
  promptTokenCounts: number[];
  promptTokens: number;
  n: number;
  /** The max_tokens sent to the engine. */
  maxTokens: number;
  /** The client's max_tokens, or the injected default before any deadline or budget cut. */
  maxTokensRequested: number;
  maxTokensSource: MaxTokensSource;
  /** Why maxTokens is below maxTokensRequested, or null. */
  maxTokensClampReason: ClampReason | null;
  /** The exact `X-Svc-Max-Tokens-Clamped` header value, or null when nothing was reduced. */
  maxTokensClamped: string | null;
  /** prompt_logprobs = -1: the body is very large and must be streamed (and gzipped on request). */
  fullVocab: boolean;
  capture: boolean;
  /** Layers the capture must return when known (for `capture_incomplete`); null when not capturing or unknown. */
  captureLayerCount: number | null;
  steering: boolean;
  /** Prompt tokens + promptCount × n × maxTokens: the worst-case token work a budget reservation covers. */
  workTokens: number;
  /** Telemetry tag; never forwarded. */
  user: string | null;
}
