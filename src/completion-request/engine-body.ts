// The engine's POST /v1/completions body (ENGINE.md), and the seed's exact reading and forwarding.
import type { ModelConfig } from '../config/index.ts';
import { MAX_SEED, type CompletionRequest } from './schema.ts';

/** Largest double not above 2^63-1: what a seed that parsed as 2^63 is forwarded as. */
const LARGEST_FORWARDABLE_SEED = 9223372036854774784;

/** What preparation settled that the engine body carries besides the request's own sampling fields. */
export interface EngineBodyParts {
  model: ModelConfig;
  maxTokens: number;
  n: number;
  stream: boolean;
  logprobs: number | null;
  promptLogprobs: number | null;
  addSpecialTokens: boolean;
  capture: boolean;
  /** The layers to capture ('all', or sorted and distinct), when capturing. */
  captureLayers: number[] | 'all' | null;
}

export function engineBodyOf(req: CompletionRequest, parts: EngineBodyParts): Record<string, unknown> {
  const { model, stream, capture, captureLayers } = parts;
  const steeringVectors = req.apply_steering_vectors ?? null;
  const engineBody: Record<string, unknown> = {
    model: model.checkpoint,
    prompt: req.prompt,
    max_tokens: parts.maxTokens,
    n: parts.n,
    temperature: req.temperature ?? 1.0,
    top_p: req.top_p ?? 1.0,
    top_k: req.top_k ?? -1,
    min_p: req.min_p ?? 0.0,
    presence_penalty: req.presence_penalty ?? 0.0,
    frequency_penalty: req.frequency_penalty ?? 0.0,
    repetition_penalty: req.repetition_penalty ?? 1.0,
    seed: forwardableSeed(req.seed ?? null),
    stop: req.stop ?? null,
    logprobs: parts.logprobs,
    prompt_logprobs: parts.promptLogprobs,
    echo: req.echo ?? false,
    add_special_tokens: parts.addSpecialTokens,
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
  if (capture || steeringVectors !== null) {
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
  return engineBody;
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
