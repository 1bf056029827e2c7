import type { FastifyInstance, onRequestAsyncHookHandler } from 'fastify';
import { Type, type Static } from 'typebox';
import { apiError } from '../errors/index.ts';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { modelIdPattern } from '../config/index.ts';
import type { ModelRegistry } from '../registry/index.ts';
import { apiKeySecurity, errorResponses, okResponse, validationErrorResponse } from './route-schema.ts';

const Stage = Type.Object({
  stage: Type.String({ description: 'Boot stage: `ready` (since `at`), `restarting` (the engine died at `at` and is being started again), `unknown` (an engine the service does not start; `at` is when the service started).' }),
  at: Type.String({ format: 'date-time' }),
});
export const BootStage = Type.Union([Stage, Type.Null()]);

export const ModelStatus = Type.Object({
  model_id: Type.String(),
  boot: BootStage,
  warm: Type.Boolean({ description: 'Advisory: a runner is up, or a completion was served recently.' }),
  activation_boot: Type.Optional(Stage),
});
export type ModelStatus = Static<typeof ModelStatus>;

export interface ModelStatusSource {
  /** Latest fresh boot stage of the model's engine, or null. */
  boot(modelId: string): Static<typeof BootStage>;
  /** Advisory warmth: a runner is up, or a completion was served recently. */
  warm(modelId: string): boolean;
  /** The activation engine's stage: never null (the contract gives `activation_boot` no null). */
  activationBoot(modelId: string): Static<typeof Stage>;
}

const StatusParams = Type.Object({ model_id: Type.String({ pattern: modelIdPattern, description: 'Short model id.' }) });

export function modelStatusRoutes(app: FastifyInstance, registry: ModelRegistry, source: ModelStatusSource, authenticate: onRequestAsyncHookHandler): void {
  const schema = {
    summary: 'Per-model warm/cold and boot-stage status',
    security: apiKeySecurity,
    params: StatusParams,
    response: { 200: okResponse('Model status', ModelStatus), ...errorResponses(400, 401, 404, 500, 503), ...validationErrorResponse },
  };
  app.withTypeProvider<TypeBoxTypeProvider>().get('/v1/models/:model_id/status', { schema, onRequest: authenticate }, async (request) => {
    const id = request.params.model_id;
    const model = registry.get(id);
    if (!model) throw apiError('model_not_found', `model "${id}" does not exist; available: ${registry.listed().map((m) => m.id).join(', ')}`);
    const body: ModelStatus = { model_id: id, boot: source.boot(id), warm: source.warm(id), ...(model.activations ? { activation_boot: source.activationBoot(id) } : {}) };
    return body;
  });
}
