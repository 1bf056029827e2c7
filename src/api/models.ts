import type { FastifyInstance, onRequestAsyncHookHandler } from 'fastify';
import { Type, type Static } from 'typebox';
import type { ModelConfig } from '../config/index.ts';
import { captureDModel, largestCaptureBytes } from '../completion-request/index.ts';
import type { Tokenizer } from '../tokenizer/index.ts';
import type { ModelRegistry } from '../registry/index.ts';
import { apiKeySecurity, errorResponses, okResponse } from './route-schema.ts';

export const ModelCapabilities = Type.Object({
  max_model_len: Type.Union([Type.Integer(), Type.Null()]),
  max_logprobs: Type.Integer(),
  prompt_logprobs_full_vocab: Type.Boolean(),
  full_vocab_max_prompt_tokens: Type.Integer(),
  max_output_work_tokens: Type.Integer(),
  max_inflight_per_key: Type.Integer(),
  max_queued_per_key: Type.Integer(),
  rate_limit_per_minute: Type.Integer(),
  logprobs: Type.Boolean(),
  prompt_logprobs: Type.Boolean(),
  chat_template: Type.Null(),
  activations: Type.Boolean({ description: 'Whether residual-stream capture and steering are served.' }),
  n_layers: Type.Optional(Type.Integer({ description: 'Decoder layers, when known (activation models).' })),
  max_steering_vectors: Type.Optional(Type.Integer()),
  max_activation_prompt_tokens: Type.Optional(Type.Integer()),
  d_model: Type.Optional(Type.Integer({ description: 'Width of the residual stream, when known (activation models).' })),
  max_capture_bytes: Type.Optional(
    Type.Union([Type.Integer(), Type.Null()], {
      description: 'Largest residual-stream capture response this model serves, in bytes (null when its size is unknown); a capture that could exceed it is refused before any engine work.',
    }),
  ),
});

export const ModelEntry = Type.Object({
  id: Type.String({ description: 'Short model id to send as `model`.' }),
  object: Type.Literal('model'),
  created: Type.Integer(),
  owned_by: Type.String(),
  default: Type.Boolean(),
  capabilities: ModelCapabilities,
});
export type ModelEntry = Static<typeof ModelEntry>;

export const ModelList = Type.Object({ object: Type.Literal('list'), data: Type.Array(ModelEntry) });

/** A model's entry; its largest capture counts the JSON its tokenizer's tokens can add per position (the floor while it is not loaded). */
export function modelEntry(model: ModelConfig, created: number, tokenizer: Tokenizer | null = null): ModelEntry {
  const activations = model.activations ?? null;
  return {
    id: model.id,
    object: 'model',
    created,
    owned_by: 'svc',
    default: model.default === true,
    capabilities: {
      ...model.capabilities,
      logprobs: true,
      prompt_logprobs: true,
      chat_template: null,
      activations: activations !== null,
      ...(activations
        ? {
            ...(activations.n_layers !== null ? { n_layers: activations.n_layers } : {}),
            max_steering_vectors: activations.max_steering_vectors,
            max_activation_prompt_tokens: activations.max_activation_prompt_tokens,
            ...(captureDModel(model) !== null ? { d_model: captureDModel(model)! } : {}),
            max_capture_bytes: largestCaptureBytes(model, tokenizer),
          }
        : {}),
    },
  };
}

/** The live models; staging models are served when named but not listed. Serialized once every listed model's tokenizer is loaded. */
export function modelRoutes(app: FastifyInstance, registry: ModelRegistry, authenticate: onRequestAsyncHookHandler): void {
  const created = Math.floor(Date.now() / 1000);
  let serialized: string | null = null;
  const body = () => {
    if (serialized !== null) return serialized;
    const models = registry.listed();
    const tokenizers = models.map((m) => {
      const state = registry.tokenizerState(m.id);
      return state?.status === 'ready' ? state.tokenizer : null;
    });
    const text = JSON.stringify({ object: 'list', data: models.map((m, i) => modelEntry(m, created, tokenizers[i])) });
    if (tokenizers.every((t) => t !== null)) serialized = text;
    return text;
  };
  body(); // sizes each tokenizer's tokens now (some milliseconds), not at the first request
  const schema = {
    summary: 'Live models with capabilities',
    security: apiKeySecurity,
    response: { 200: okResponse('Model list', ModelList), ...errorResponses(401, 500, 503) },
  };
  app.get('/v1/models', { schema, onRequest: authenticate }, async (_request, reply) => reply.type('application/json; charset=utf-8').send(body()));
}
