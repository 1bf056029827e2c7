import type { FastifyInstance } from 'fastify';
import { Type, type Static } from 'typebox';
import type { ModelConfig } from '../config/index.ts';

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

export function modelEntry(model: ModelConfig, created: number): ModelEntry {
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
          }
        : {}),
    },
  };
}

/** The live models; staging models are served when named but not listed. Serialized once. */
export function modelRoutes(app: FastifyInstance, models: ModelConfig[]): void {
  const created = Math.floor(Date.now() / 1000);
  const body = JSON.stringify({ object: 'list', data: models.filter((m) => m.status !== 'staging').map((m) => modelEntry(m, created)) });
  app.get('/v1/models', async (_request, reply) => reply.type('application/json; charset=utf-8').send(body));
}
