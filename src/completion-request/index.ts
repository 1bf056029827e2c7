// POST /v1/completions before dispatch: strict validation, model resolution, pre-flight (tokenize once,
// context and capture length, deadline) and the engine request body. Pure and synchronous apart from
// reading the registry, so admission (keys, limits, budget) slots in between this and dispatch.
import { Compile } from 'typebox/compile';
import type { ModelConfig } from '../config/index.ts';
import { apiError, type ApiError } from '../errors/index.ts';
import type { ModelRegistry } from '../registry/index.ts';
import { CompletionRequest, MAX_SEED } from './schema.ts';
import { schemaError, invalid } from './schema-errors.ts';
import { steeringVectorError } from './steering.ts';
import { captureBytePositionLimit, captureDModel, capturePositionLimit } from './capture-size.ts';
import { countTokens, type Tokenizer, type TokenizerPool } from '../tokenizer/index.ts';

export { CompletionRequest, CompletionPrompt, SteeringVector, TensorCodec, StreamOptions, MAX_SEED } from './schema.ts';
export { captureBodyBytes, captureBytesPerPosition, largestCaptureBytes, captureDModel, tokenTextJsonBytes } from './capture-size.ts';

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

/** The contract's cap on an injected default max_tokens. */
export const DEFAULT_MAX_TOKENS_CAP = 32_000;
/** Largest double not above 2^63-1: what a seed that parsed as 2^63 is forwarded as. */
const LARGEST_FORWARDABLE_SEED = 9223372036854774784;

const checkRequest = Compile(CompletionRequest);

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

/**
 * Validates a parsed JSON body and runs the pre-flight checks; throws an ApiError (400 with the field
 * named, 503 `tokenizer_unavailable`) or returns what dispatch needs. Tokenizes each text prompt once.
 */
export function prepareCompletion(body: unknown, ctx: CompletionContext): PreparedCompletion {
  const error = completionRequestError(body);
  if (error) throw error;
  return prepareValidCompletion(body as CompletionRequest, ctx);
}

/** The body's first schema problem as a 400 naming the field, or null when it matches (one compiled check). */
export function completionRequestError(body: unknown): ApiError | null {
  return checkRequest.Check(body) ? null : schemaError(body);
}

/** `prepareCompletion` for a body that already passed `completionRequestError` (the route's validator). */
export function prepareValidCompletion(req: CompletionRequest, ctx: CompletionContext): PreparedCompletion {
  const counting = beginCompletion(req, ctx);
  return counting.finish(counting.texts.map((text) => counting.tokenizer.encode(text, counting.addSpecialTokens).length));
}

/**
 * `prepareValidCompletion`, with text prompts longer than OFF_THREAD_UNITS in total tokenized in the context's
 * tokenizer pool (worker threads), so that the event loop goes on serving other requests meanwhile.
 */
export async function prepareValidCompletionAsync(req: CompletionRequest, ctx: CompletionContext): Promise<PreparedCompletion> {
  const counting = beginCompletion(req, ctx);
  return counting.finish(await countTokens(ctx.tokenizers, counting.model.tokenizer, counting.tokenizer, counting.texts, counting.addSpecialTokens));
}

/** Every check up to counting the text prompts' tokens, and the rest of the preparation once they are counted. */
interface CountingCompletion {
  model: ModelConfig;
  tokenizer: Tokenizer;
  addSpecialTokens: boolean;
  /** The text prompts (none for token-id prompts). */
  texts: string[];
  /** `counts`: the tokens of each of `texts`. */
  finish(counts: number[]): PreparedCompletion;
}

function beginCompletion(req: CompletionRequest, ctx: CompletionContext): CountingCompletion {
  const model = ctx.registry.resolve(req.model);
  const caps = model.capabilities;

  const stream = req.stream === true;
  const n = req.n ?? 1;
  const prompt = req.prompt;
  const batch = Array.isArray(prompt) && (typeof prompt[0] === 'string' || Array.isArray(prompt[0]));
  const promptCount = batch ? prompt.length : 1;
  const logprobs = req.logprobs ?? null;
  const promptLogprobs = req.prompt_logprobs ?? null;
  const capture = req.output_residual_stream !== undefined && req.output_residual_stream !== false;
  const steeringVectors = req.apply_steering_vectors ?? null;
  const steering = steeringVectors !== null;
  const explicitMax = req.max_tokens ?? null;

  // Streaming rules.
  if (!stream && req.stream_options !== undefined && req.stream_options !== null) {
    throw invalid('stream_options', 'stream_options: only allowed with stream true');
  }
  if (stream && promptLogprobs !== null && promptLogprobs !== 0) {
    throw invalid('prompt_logprobs', 'prompt_logprobs: values above 0 and -1 are not allowed with stream true (0 is)');
  }
  if (stream && capture) throw invalid('output_residual_stream', 'output_residual_stream: capture requests cannot stream; send stream false');

  // Fan-out and work.
  // A list of prompts is a batch even when it holds one (the contract: "A string[] or int[][] is a batch").
  if (explicitMax === null && (batch || n > 1)) {
    throw invalid('max_tokens', `max_tokens: required for a batch of prompts or n > 1 (prompt_count ${promptCount}, n ${n})`);
  }
  if (explicitMax !== null && promptCount * n * explicitMax > caps.max_output_work_tokens) {
    throw invalid(
      'max_tokens',
      `max_tokens: prompt_count (${promptCount}) × n (${n}) × max_tokens (${explicitMax}) = ${promptCount * n * explicitMax} exceeds ${caps.max_output_work_tokens}`,
    );
  }

  // Per-model logprob caps.
  if (logprobs !== null && logprobs > caps.max_logprobs) {
    throw invalid('logprobs', `logprobs: must be <= ${caps.max_logprobs} on model ${model.id} (capabilities.max_logprobs)`);
  }
  if (promptLogprobs !== null && promptLogprobs > caps.max_logprobs) {
    throw invalid('prompt_logprobs', `prompt_logprobs: must be <= ${caps.max_logprobs} on model ${model.id} (capabilities.max_logprobs)`);
  }
  if (promptLogprobs === -1 && !caps.prompt_logprobs_full_vocab) {
    throw invalid('prompt_logprobs', `prompt_logprobs: -1 (full vocabulary) is not supported by model ${model.id}`);
  }

  // Activations: capture and steering.
  let captureLayers: number[] | 'all' | null = null;
  let captureLayerCount: number | null = null;
  const act = model.activations ?? null;
  if (capture || steering) {
    const what = capture ? 'output_residual_stream' : 'apply_steering_vectors';
    if (act === null) throw apiError('activations_unsupported', `${what}: model ${model.id} has no activation engine`, { fields: { param: what } });
    // A capture answers with one tensor, for one sequence (ENGINE.md); steering applies to every sequence.
    if (capture && (promptCount !== 1 || n !== 1)) {
      throw invalid(what, `${what}: activation capture needs a single prompt with n = 1 (prompt_count ${promptCount}, n ${n})`);
    }
  }
  if (capture && act) {
    if (req.output_residual_stream === true) {
      captureLayers = 'all';
      captureLayerCount = act.n_layers;
    } else {
      const layers = [...new Set(req.output_residual_stream as number[])].sort((a, b) => a - b);
      if (act.n_layers !== null && layers[layers.length - 1] >= act.n_layers) {
        const list = req.output_residual_stream as number[];
        const bad = list.findIndex((l) => l >= act.n_layers!);
        throw invalid('output_residual_stream', `output_residual_stream[${bad}]: layer ${list[bad]} is out of range (the model has layers 0..${act.n_layers - 1})`);
      }
      captureLayers = layers;
      captureLayerCount = layers.length;
    }
  }
  if (steeringVectors !== null && act) {
    if (steeringVectors.length > act.max_steering_vectors) {
      throw invalid('apply_steering_vectors', `apply_steering_vectors: at most ${act.max_steering_vectors} steering vectors on model ${model.id} (got ${steeringVectors.length})`);
    }
    const steered = { id: model.id, nLayers: act.n_layers, dModel: captureDModel(model), maxPositions: caps.max_model_len };
    for (let i = 0; i < steeringVectors.length; i++) {
      const error = steeringVectorError(steeringVectors[i], i, steered);
      if (error) throw error;
    }
  }

  // Deadline of an explicit max_tokens (non-streaming only; streams have no window).
  const feasible = Math.max(1, deadlineFeasibleTokens(ctx.requestWindowMs, ctx.deadlineTokensPerSecond));
  if (!stream && explicitMax !== null && explicitMax > feasible) {
    throw apiError(
      'deadline_infeasible',
      `max_tokens: ${explicitMax} cannot finish within the ${windowText(ctx.requestWindowMs)} non-streaming request window (at most ${feasible} tokens at ${ctx.deadlineTokensPerSecond} tokens/s); lower max_tokens or set stream true`,
      { fields: { param: 'max_tokens' } },
    );
  }

  // Pre-flight: token-id prompts against the vocabulary; text prompts proved too long for the context by a lower
  // bound on their tokens are refused before they are tokenized, the others are counted once (finish).
  const tokenizer = ctx.registry.tokenizer(model.id);
  const addSpecialTokens = req.add_special_tokens ?? true;
  const maxModelLen = caps.max_model_len;
  const texts = typeof prompt === 'string' ? [prompt] : typeof prompt[0] === 'string' ? (prompt as string[]) : [];
  const idCounts: number[] = [];
  const vocab = tokenizer.vocabSize;
  if (typeof prompt[0] === 'number') {
    checkVocab(prompt as number[], vocab, 'prompt');
    idCounts.push(prompt.length);
  } else if (typeof prompt !== 'string' && Array.isArray(prompt[0])) {
    (prompt as number[][]).forEach((ids, i) => {
      checkVocab(ids, vocab, `prompt[${i}]`);
      idCounts.push(ids.length);
    });
  }
  if (maxModelLen !== null && texts.length > 0) {
    let most = 0;
    let at = 0;
    texts.forEach((text, i) => {
      const bound = tokenizer.minTokens(text, addSpecialTokens);
      if (bound > most) (most = bound), (at = i);
    });
    // In the order the counted checks come (finishCompletion), so that a bound refuses what the count would.
    const name = batch ? `prompt[${at}]` : 'prompt';
    const said = tokenizer.minTokensExact ? String(most) : `at least ${most}`;
    if (explicitMax !== null) checkContext(name, said, most, explicitMax, maxModelLen, model.id);
    else if (promptLogprobs === -1) checkFullVocab(name, said, most, caps.full_vocab_max_prompt_tokens);
    else checkContext(name, said, most, null, maxModelLen, model.id);
  }
  return { model, tokenizer, addSpecialTokens, texts, finish: (counts) => finishCompletion(texts.length > 0 ? counts : idCounts) };

  function finishCompletion(promptTokenCounts: number[]): PreparedCompletion {
    let longest = 0;
    for (let i = 1; i < promptTokenCounts.length; i++) if (promptTokenCounts[i] > promptTokenCounts[longest]) longest = i;
    const longestTokens = promptTokenCounts[longest];
    const promptName = batch ? `prompt[${longest}]` : 'prompt';

    if (explicitMax !== null && maxModelLen !== null) checkContext(promptName, String(longestTokens), longestTokens, explicitMax, maxModelLen, model.id);
    if (promptLogprobs === -1) checkFullVocab(promptName, String(longestTokens), longestTokens, caps.full_vocab_max_prompt_tokens);

    // Capture length: prompt + max_tokens - 1 positions, more of them when fewer layers are captured, and
    // no more than the model's largest capture in bytes allows.
    let capturePositions: number | null = null;
    let captureBoundByBytes = false;
    if (capture && act) {
      const requested = captureLayers === 'all' ? act.n_layers : captureLayers!.length;
      capturePositions = capturePositionLimit(model, requested);
      const byBytes = captureBytePositionLimit(model, requested, tokenizer);
      if (byBytes < capturePositions) {
        capturePositions = byBytes;
        captureBoundByBytes = true;
      }
    }

    // max_tokens: the client's, or the injected default.
    let maxTokensRequested: number;
    let maxTokens: number;
    let clampReason: ClampReason | null = null;
    const source: MaxTokensSource = explicitMax === null ? 'default' : 'client';
    if (explicitMax !== null) {
      maxTokensRequested = maxTokens = explicitMax;
    } else {
      let room = Math.min(DEFAULT_MAX_TOKENS_CAP, caps.max_output_work_tokens);
      if (maxModelLen !== null) {
        checkContext(promptName, String(longestTokens), longestTokens, null, maxModelLen, model.id);
        room = Math.min(room, maxModelLen - longestTokens);
      }
      if (capturePositions !== null) room = Math.min(room, capturePositions - longestTokens + 1);
      maxTokensRequested = maxTokens = room;
      if (!stream && maxTokens > feasible) {
        maxTokens = feasible;
        clampReason = 'deadline';
      }
    }
    if (capturePositions !== null && (maxTokens < 1 || longestTokens + maxTokens - 1 > capturePositions)) {
      const layers = captureLayers === 'all' ? 'all layers' : `${captureLayerCount} layer(s)`;
      const needs = longestTokens + Math.max(maxTokens, 1) - 1;
      const message = captureBoundByBytes
        ? `output_residual_stream: captures of model ${model.id} are served up to ${act!.max_capture_bytes} bytes (activations.max_capture_bytes); capturing ${layers} fits ${capturePositions} positions (prompt tokens + max_tokens - 1) in that bound; this request needs ${needs}`
        : `output_residual_stream: capturing ${layers} of model ${model.id} allows ${capturePositions} positions (prompt tokens + max_tokens - 1); this request needs ${needs}`;
      throw apiError('activation_prompt_too_long', message, { fields: { param: 'output_residual_stream' } });
    }

    const engineBody: Record<string, unknown> = {
      model: model.checkpoint,
      prompt,
      max_tokens: maxTokens,
      n,
      temperature: req.temperature ?? 1.0,
      top_p: req.top_p ?? 1.0,
      top_k: req.top_k ?? -1,
      min_p: req.min_p ?? 0.0,
      presence_penalty: req.presence_penalty ?? 0.0,
      frequency_penalty: req.frequency_penalty ?? 0.0,
      repetition_penalty: req.repetition_penalty ?? 1.0,
      seed: forwardableSeed(req.seed ?? null),
      stop: req.stop ?? null,
      logprobs,
      prompt_logprobs: promptLogprobs,
      echo: req.echo ?? false,
      add_special_tokens: addSpecialTokens,
      stream,
    };
    if (stream) {
      // The engine always reports usage on a stream (every stream is billed); the gateway drops that
      // frame when the client did not ask for it (clientWantsUsage).
      engineBody.stream_options = {
        include_usage: true,
        continuous_usage_stats: req.stream_options?.continuous_usage_stats ?? false,
      };
    }
    if (capture || steering) {
      const xargs: Record<string, string> = {};
      if (capture) xargs.output_residual_stream = captureLayers === 'all' ? 'true' : JSON.stringify(captureLayers);
      if (steeringVectors !== null) {
        xargs.apply_steering_vectors = JSON.stringify(
          steeringVectors.map((v) => ({
            activations: v.activations,
            layer_indices: v.layer_indices,
            scale: v.scale ?? 1.0,
            norm_match: v.norm_match ?? false,
            position_indices: v.position_indices ?? null,
          })),
        );
      }
      engineBody.vllm_xargs = xargs;
    }

    const promptTokens = promptTokenCounts.reduce((a, b) => a + b, 0);
    return {
      model,
      stream,
      engineBody,
      clientWantsUsage: stream && (req.stream_options?.include_usage ?? false),
      promptCount,
      promptTokenCounts,
      promptTokens,
      n,
      maxTokens,
      maxTokensRequested,
      maxTokensSource: source,
      maxTokensClampReason: clampReason,
      maxTokensClamped: clampReason ? formatMaxTokensClamped(maxTokensRequested, maxTokens, clampReason, source) : null,
      fullVocab: promptLogprobs === -1,
      capture,
      captureLayerCount,
      steering,
      workTokens: promptTokens + promptCount * n * maxTokens,
      user: req.user ?? null,
    };
  }
}

/**
 * The contract's context rule: prompt tokens + max_tokens within max_model_len, or, for an injected default, at
 * least one token of room. `tokens` is the prompt's count, or a lower bound on it (`said` then says "at least").
 */
function checkContext(promptName: string, said: string, tokens: number, explicitMax: number | null, maxModelLen: number, modelId: string, reportedBy = ''): void {
  if (explicitMax !== null && tokens + explicitMax > maxModelLen) {
    throw apiError(
      'context_length_exceeded',
      `${promptName}: ${said} prompt tokens + max_tokens ${explicitMax} = ${tokens + explicitMax} exceeds the context length ${maxModelLen} of model ${modelId}${reportedBy}`,
      { fields: { param: 'prompt' } },
    );
  }
  if (explicitMax === null && tokens >= maxModelLen) {
    throw apiError(
      'context_length_exceeded',
      `${promptName}: ${said} prompt tokens leave no room to generate within the context length ${maxModelLen} of model ${modelId}${reportedBy}`,
      { fields: { param: 'prompt' } },
    );
  }
}

/** prompt_logprobs -1 is served up to the model's full-vocabulary prompt cap. */
function checkFullVocab(promptName: string, said: string, tokens: number, cap: number): void {
  if (tokens > cap) {
    throw apiError('full_vocab_prompt_too_long', `${promptName}: ${said} tokens is longer than the ${cap} tokens allowed with prompt_logprobs -1 (full vocabulary)`, {
      fields: { param: 'prompt' },
    });
  }
}

function checkVocab(ids: readonly number[], vocabSize: number, name: string): void {
  for (let j = 0; j < ids.length; j++) {
    if (ids[j] >= vocabSize) {
      throw invalid('prompt', `${name}[${j}]: token id ${ids[j]} is out of range (the vocabulary has ${vocabSize} ids, 0..${vocabSize - 1})`);
    }
  }
}

/**
 * `JSON.parse` rounds integers above 2^53, so 2^63-1 (the largest seed) and 2^63 (out of range) both
 * read as the double 2^63. For a top-level `seed` read that way, its literal in the body's text decides:
 * above 2^63-1 it becomes Infinity, which the schema refuses with the seed's range like any other
 * out-of-range value. Anything else is returned as parsed.
 */
export function withExactSeed(parsed: unknown, text: string): unknown {
  const seed = (parsed as { seed?: unknown } | null)?.seed;
  if (seed !== MAX_SEED) return parsed; // every other double is exact enough for the schema to judge
  // The key as it can appear at any depth; only the top-level one parsed to this value, and nested
  // objects of a completion body have no `seed`, so one match is the one (several: left to the schema).
  const literals = [...text.matchAll(/"seed"\s*:\s*(\d+)\s*[,}]/g)];
  if (literals.length === 1 && BigInt(literals[0][1]) > 2n ** 63n - 1n) (parsed as { seed: number }).seed = Infinity;
  return parsed;
}

/** JSON numbers above 2^53 are already rounded when parsed; 2^63-1 parses as 2^63, which int64 engines reject. */
function forwardableSeed(seed: number | null): number | null {
  return seed !== null && seed >= MAX_SEED ? LARGEST_FORWARDABLE_SEED : seed;
}

function windowText(ms: number): string {
  if (ms % 60_000 === 0) return `${ms / 60_000}-minute`;
  if (ms % 1000 === 0) return `${ms / 1000}-second`;
  return `${ms} ms`;
}
