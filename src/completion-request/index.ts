// POST /v1/completions before dispatch: strict validation, model resolution, pre-flight (tokenize once,
// context and capture length, deadline) and the engine request body. Pure and synchronous apart from
// reading the registry, so admission (keys, limits, budget) slots in between this and dispatch.
import { Compile } from 'typebox/compile';
import type { ModelConfig } from '../config/index.ts';
import { apiError, type ApiError } from '../errors/index.ts';
import { CompletionRequest } from './schema.ts';
import { schemaError, invalid } from './schema-errors.ts';
import { steeringVectorError } from './steering.ts';
import { captureBytePositionLimit, captureDModel, capturePositionLimit } from './capture-size.ts';
import { countTokens, type Tokenizer } from '../tokenizer/index.ts';
import { checkContext, checkFullVocab, checkVocab } from './prompt-limits.ts';
import { DEFAULT_MAX_TOKENS_CAP, deadlineFeasibleTokens, formatMaxTokensClamped, windowText } from './max-tokens.ts';
import { engineBodyOf } from './engine-body.ts';
import type { ClampReason, CompletionContext, MaxTokensSource, PreparedCompletion } from './types.ts';

export { CompletionRequest, CompletionPrompt, SteeringVector, TensorCodec, StreamOptions, MAX_SEED } from './schema.ts';
export { captureBodyBytes, captureBytesPerPosition, largestCaptureBytes, captureDModel, tokenTextJsonBytes } from './capture-size.ts';
export type { ClampReason, CompletionContext, MaxTokensSource, PreparedCompletion } from './types.ts';
export { DEFAULT_MAX_TOKENS_CAP, deadlineFeasibleTokens, fitDefaultToContext, formatMaxTokensClamped, lowerMaxTokens, needsEngineContextLength } from './max-tokens.ts';
export { withExactSeed } from './engine-body.ts';

const checkRequest = Compile(CompletionRequest);

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
 * tokenizer pool (worker threads), so that the event loop goes on serving other requests meanwhile. `model`:
 * the model `req.model` names, when the caller resolved it already (the route's own step).
 */
export async function prepareValidCompletionAsync(req: CompletionRequest, ctx: CompletionContext, model?: ModelConfig): Promise<PreparedCompletion> {
  const counting = beginCompletion(req, ctx, model);
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

function beginCompletion(req: CompletionRequest, ctx: CompletionContext, model = ctx.registry.resolve(req.model)): CountingCompletion {
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

    const engineBody = engineBodyOf(req, { model, maxTokens, n, stream, logprobs, promptLogprobs, addSpecialTokens, capture, captureLayers });

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
