import type { FastifyInstance } from 'fastify';
import { Type, type Static } from 'typebox';
import { apiError } from '../errors/index.ts';
import type { ModelConfig } from '../config/index.ts';

export const BootStage = Type.Union([
  Type.Object({
    stage: Type.String({ description: 'Cold-boot stage, e.g. "ready".' }),
    at: Type.String({ format: 'date-time' }),
  }),
  Type.Null(),
]);

export const ModelStatus = Type.Object({
  model_id: Type.String(),
  boot: BootStage,
  warm: Type.Boolean({ description: 'Advisory: a runner is up, or a completion was served recently.' }),
  activation_boot: Type.Optional(BootStage),
});
export type ModelStatus = Static<typeof ModelStatus>;

export interface ModelStatusSource {
  /** Latest fresh boot stage of the model's engine, or null. */
  boot(modelId: string): Static<typeof BootStage>;
  /** Advisory warmth: a runner is up, or a completion was served recently. */
  warm(modelId: string): boolean;
}

const modelIdPattern = /^[A-Za-z0-9._-]{1,64}$/;

export function modelStatusRoutes(app: FastifyInstance, models: ModelConfig[], source: ModelStatusSource): void {
  const byId = new Map(models.map((m) => [m.id, m]));
  app.get<{ Params: { model_id: string } }>('/v1/models/:model_id/status', async (request) => {
    const id = request.params.model_id;
    if (!modelIdPattern.test(id)) throw apiError('invalid_request', 'model_id: must match ^[A-Za-z0-9._-]{1,64}$');
    const model = byId.get(id);
    if (!model) throw apiError('model_not_found', `model "${id}" does not exist; available: ${models.filter((m) => m.status !== 'staging').map((m) => m.id).join(', ')}`);
    const boot = source.boot(id);
    // The reference engine serves activations from the same process, so both boots are the same boot.
    const body: ModelStatus = { model_id: id, boot, warm: source.warm(id), ...(model.activations ? { activation_boot: boot } : {}) };
    return body;
  });
}
