// Parses a /v1/completions body the way vLLM does: unknown fields ignored, vLLM defaults, 400s with `param`.
import type { Tokenizer } from '../tokenizer/index.ts';
import { decodeTensor, CodecError, type EncodedTensor } from '../codec/index.ts';
import type { SamplingParams } from './sampling.ts';
import { badRequest } from './errors.ts';

export interface SteeringVector {
  layers: number[];
  /** [layers][rows][d] flattened; rows = 1 for a broadcast (2-D) vector. */
  values: Float32Array;
  rows: number;
  /** Absolute position -> row, or null when the vector applies at every position. */
  positions: Map<number, number> | null;
  scale: number;
  normMatch: boolean;
}

export interface CompletionRequest {
  prompts: number[][];
  /** The prompt's text (string prompts) for echo; null for token-id prompts. */
  promptTexts: (string | null)[];
  /** null = the remaining context. */
  maxTokens: number | null;
  n: number;
  sampling: SamplingParams;
  seed: number | null;
  stop: string[];
  ignoreEos: boolean;
  logprobs: number | null;
  promptLogprobs: number | null;
  echo: boolean;
  stream: boolean;
  includeUsage: boolean;
  continuousUsage: boolean;
  capture: number[] | null;
  steering: SteeringVector[];
}

export interface EngineLimits {
  maxModelLen: number;
  maxLogprobs: number;
  nLayers: number;
  dModel: number;
}

type Body = Record<string, unknown>;

const isInt = (v: unknown): v is number => typeof v === 'number' && Number.isInteger(v);
const isNum = (v: unknown): v is number => typeof v === 'number' && Number.isFinite(v);

function num(body: Body, key: string, fallback: number, ok: (v: number) => boolean, rule: string): number {
  const v = body[key];
  if (v === undefined || v === null) return fallback;
  if (!isNum(v)) throw badRequest(`${key} must be a number`, key);
  if (!ok(v)) throw badRequest(`${key} ${rule}, got ${v}.`, key);
  return v;
}

function int(body: Body, key: string, fallback: number | null, ok: (v: number) => boolean, rule: string): number | null {
  const v = body[key];
  if (v === undefined || v === null) return fallback;
  if (!isInt(v)) throw badRequest(`${key} must be an integer`, key);
  if (!ok(v)) throw badRequest(`${key} ${rule}, got ${v}.`, key);
  return v;
}

function bool(body: Body, key: string, fallback: boolean): boolean {
  const v = body[key];
  if (v === undefined || v === null) return fallback;
  if (typeof v !== 'boolean') throw badRequest(`${key} must be a boolean`, key);
  return v;
}

export function parseCompletionRequest(body: Body, tokenizer: Tokenizer, limits: EngineLimits): CompletionRequest {
  const addSpecialTokens = bool(body, 'add_special_tokens', true);
  const { prompts, promptTexts } = parsePrompts(body.prompt, tokenizer, addSpecialTokens);
  const stream = bool(body, 'stream', false);
  const so = body.stream_options;
  if (so !== undefined && so !== null) {
    if (!stream) throw badRequest('Stream options can only be defined when `stream=True`.', 'stream_options');
    if (typeof so !== 'object' || Array.isArray(so)) throw badRequest('stream_options must be an object', 'stream_options');
  }
  const streamOptions = (so ?? {}) as Body;
  const logprobs = int(body, 'logprobs', null, (v) => v >= 0 && v <= limits.maxLogprobs, `must be between 0 and ${limits.maxLogprobs}`);
  const promptLogprobs = int(body, 'prompt_logprobs', null, (v) => v === -1 || (v >= 0 && v <= limits.maxLogprobs), `must be -1 or between 0 and ${limits.maxLogprobs}`);
  // vLLM refuses only top-k (> 0) and full-vocabulary (-1) prompt logprobs on a stream; 0 is accepted (the stream carries no prompt_logprobs).
  if (stream && promptLogprobs !== null && promptLogprobs !== 0) throw badRequest('`prompt_logprobs` are not available when `stream=True`.', 'prompt_logprobs');
  const stopRaw = body.stop;
  let stop: string[] = [];
  if (typeof stopRaw === 'string') stop = [stopRaw];
  else if (Array.isArray(stopRaw)) {
    if (!stopRaw.every((s) => typeof s === 'string')) throw badRequest('stop must be a string or a list of strings', 'stop');
    stop = stopRaw as string[];
  } else if (stopRaw !== undefined && stopRaw !== null) throw badRequest('stop must be a string or a list of strings', 'stop');
  stop = stop.filter((s) => s.length > 0);
  const seedRaw = body.seed;
  if (seedRaw !== undefined && seedRaw !== null && (!isInt(seedRaw) || seedRaw < -(2 ** 63) || seedRaw > 2 ** 64)) throw badRequest('seed must be an integer', 'seed');
  const xargs = (body.vllm_xargs ?? {}) as Body;
  if (typeof xargs !== 'object' || Array.isArray(xargs)) throw badRequest('vllm_xargs must be an object', 'vllm_xargs');
  const capture = parseCapture(xargs.output_residual_stream, limits);
  const steering = parseSteering(xargs.apply_steering_vectors, limits);
  const n = int(body, 'n', 1, (v) => v >= 1, 'must be at least 1')!;
  if (capture && (prompts.length !== 1 || n !== 1)) throw badRequest('output_residual_stream requires a single prompt and n=1', 'vllm_xargs.output_residual_stream');
  if (capture && stream) throw badRequest('output_residual_stream is not available when `stream=True`.', 'vllm_xargs.output_residual_stream');
  const req: CompletionRequest = {
    prompts,
    promptTexts,
    maxTokens: 'max_tokens' in body ? int(body, 'max_tokens', null, (v) => v >= 1, 'must be at least 1') : 16,
    n,
    sampling: {
      temperature: num(body, 'temperature', 1, (v) => v >= 0, 'must be non-negative'),
      topP: num(body, 'top_p', 1, (v) => v > 0 && v <= 1, 'must be in (0, 1]'),
      topK: int(body, 'top_k', -1, (v) => v === -1 || v >= 0, 'must be -1 (disable), or at least 1')!,
      minP: num(body, 'min_p', 0, (v) => v >= 0 && v <= 1, 'must be in [0, 1]'),
      presencePenalty: num(body, 'presence_penalty', 0, (v) => v >= -2 && v <= 2, 'must be in [-2, 2]'),
      frequencyPenalty: num(body, 'frequency_penalty', 0, (v) => v >= -2 && v <= 2, 'must be in [-2, 2]'),
      repetitionPenalty: num(body, 'repetition_penalty', 1, (v) => v > 0 && v <= 2, 'must be in (0, 2]'),
    },
    seed: isInt(seedRaw) ? seedRaw : null,
    stop,
    ignoreEos: bool(body, 'ignore_eos', false),
    logprobs,
    promptLogprobs,
    echo: bool(body, 'echo', false),
    stream,
    includeUsage: bool(streamOptions, 'include_usage', false),
    continuousUsage: bool(streamOptions, 'continuous_usage_stats', false),
    capture,
    steering,
  };
  for (let i = 0; i < prompts.length; i++) {
    const len = prompts[i].length;
    const max = req.maxTokens ?? limits.maxModelLen - len;
    if (len >= limits.maxModelLen || len + max > limits.maxModelLen) {
      throw badRequest(
        `This model's maximum context length is ${limits.maxModelLen} tokens. However, you requested ${len + Math.max(max, 0)} tokens (${len} in the messages, ${Math.max(max, 0)} in the completion). Please reduce the length of the messages or completion.`,
        'max_tokens',
      );
    }
  }
  return req;
}

function parsePrompts(prompt: unknown, tokenizer: Tokenizer, addSpecialTokens: boolean): { prompts: number[][]; promptTexts: (string | null)[] } {
  const shape = 'prompt must be a string, a list of strings, a list of token ids or a list of token-id lists';
  const fromText = (s: string) => {
    const ids = tokenizer.encode(s, addSpecialTokens);
    // vLLM raises these as plain ValueErrors: no `param`, so they are not mistaken for its context-limit errors (param `input_tokens`).
    if (ids.length === 0) throw badRequest('The decoder prompt cannot be empty');
    return ids;
  };
  const fromIds = (ids: unknown[]) => {
    if (ids.length === 0) throw badRequest('The decoder prompt cannot be empty');
    for (const id of ids) {
      if (!isInt(id)) throw badRequest(shape, 'prompt');
      if (id < 0 || id >= tokenizer.vocabSize) throw badRequest(`Token id ${id} is out of vocabulary`);
    }
    return ids as number[];
  };
  if (typeof prompt === 'string') return { prompts: [fromText(prompt)], promptTexts: [prompt] };
  if (!Array.isArray(prompt) || prompt.length === 0) throw badRequest(shape, 'prompt');
  if (prompt.every((p) => typeof p === 'string')) return { prompts: prompt.map(fromText), promptTexts: prompt as string[] };
  if (prompt.every((p) => typeof p === 'number')) return { prompts: [fromIds(prompt)], promptTexts: [null] };
  if (prompt.every((p) => Array.isArray(p))) return { prompts: prompt.map((p) => fromIds(p as unknown[])), promptTexts: prompt.map(() => null) };
  throw badRequest(shape, 'prompt');
}

function xarg(raw: unknown): unknown {
  if (typeof raw !== 'string') return raw;
  try {
    return JSON.parse(raw);
  } catch {
    return raw;
  }
}

function parseCapture(raw: unknown, limits: EngineLimits): number[] | null {
  const param = 'vllm_xargs.output_residual_stream';
  if (raw === undefined || raw === null || raw === false || raw === 'false') return null;
  const v = xarg(raw);
  if (v === true) return Array.from({ length: limits.nLayers }, (_, i) => i);
  if (!Array.isArray(v) || v.length === 0 || !v.every(isInt)) throw badRequest('output_residual_stream must be "true" or a JSON list of layer indices', param);
  for (const l of v) {
    if (l < 0 || l >= limits.nLayers) throw badRequest(`output_residual_stream layer ${l} is out of range: the model has ${limits.nLayers} layers (0..${limits.nLayers - 1})`, param);
  }
  return [...new Set(v as number[])].sort((a, b) => a - b);
}

function parseSteering(raw: unknown, limits: EngineLimits): SteeringVector[] {
  const param = 'vllm_xargs.apply_steering_vectors';
  if (raw === undefined || raw === null) return [];
  const list = xarg(raw);
  if (list === null) return [];
  if (!Array.isArray(list)) throw badRequest('apply_steering_vectors must be a JSON list of steering vectors', param);
  return list.map((item, i) => {
    const at = `${param}[${i}]`;
    if (item === null || typeof item !== 'object' || Array.isArray(item)) throw badRequest('a steering vector must be an object', at);
    const s = item as Body;
    const layers = s.layer_indices;
    if (!Array.isArray(layers) || layers.length === 0 || !layers.every(isInt)) throw badRequest('layer_indices must be a non-empty list of integers', `${at}.layer_indices`);
    for (const l of layers as number[]) {
      if (l < 0 || l >= limits.nLayers) throw badRequest(`steering layer ${l} is out of range: the model has ${limits.nLayers} layers (0..${limits.nLayers - 1})`, `${at}.layer_indices`);
    }
    let tensor;
    try {
      tensor = decodeTensor(s.activations as EncodedTensor); // validated inside
    } catch (err) {
      if (err instanceof CodecError) throw badRequest(`activations: ${err.message}`, `${at}.activations`);
      throw err;
    }
    const shape = tensor.shape;
    if ((shape.length !== 2 && shape.length !== 3) || shape[0] !== layers.length || shape[shape.length - 1] !== limits.dModel) {
      throw badRequest(`activations shape ${JSON.stringify(shape)} must be (${layers.length}, ${limits.dModel}) or (${layers.length}, n_positions, ${limits.dModel})`, `${at}.activations`);
    }
    for (const v of tensor.values) if (!Number.isFinite(v)) throw badRequest('activations must be finite', `${at}.activations`);
    const scale = s.scale === undefined || s.scale === null ? 1 : s.scale;
    if (!isNum(scale)) throw badRequest('scale must be a number', `${at}.scale`);
    const normMatch = s.norm_match === undefined || s.norm_match === null ? false : s.norm_match;
    if (typeof normMatch !== 'boolean') throw badRequest('norm_match must be a boolean', `${at}.norm_match`);
    const pi = s.position_indices;
    let positions: Map<number, number> | null = null;
    const rows = shape.length === 3 ? shape[1] : 1;
    if (shape.length === 2) {
      if (pi !== undefined && pi !== null) throw badRequest('position_indices requires 3-D activations (n_layers, n_positions, d_model)', `${at}.position_indices`);
    } else {
      positions = new Map();
      if (pi === undefined || pi === null) for (let r = 0; r < rows; r++) positions.set(r, r);
      else {
        if (!Array.isArray(pi) || pi.length !== rows || !pi.every((p) => isInt(p) && p >= 0)) {
          throw badRequest(`position_indices must list ${rows} non-negative positions (one per activations row)`, `${at}.position_indices`);
        }
        (pi as number[]).forEach((p, r) => positions!.set(p, r));
      }
    }
    return { layers: layers as number[], values: tensor.values, rows, positions, scale, normMatch };
  });
}
