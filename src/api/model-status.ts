import type { FastifyInstance, onRequestAsyncHookHandler } from 'fastify';
import { Type, type Static } from 'typebox';
import { apiError } from '../errors/index.ts';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { modelIdPattern } from '../config/index.ts';
import type { ModelRegistry } from '../registry/index.ts';
import { bootStages, type BootStage as BootStageName, type Platform, type PublishedStage } from '../platforms/index.ts';
import { apiKeySecurity, errorResponses, okResponse, validationErrorResponse } from './route-schema.ts';

const StageName = Type.Unsafe<BootStageName>({
  type: 'string',
  enum: [...bootStages],
  description: 'The latest cold-boot stage, in boot order; `failed`: the boot did not make it, or the engine died (see `reason`).',
});

/** A published boot stage with its age. */
const Stage = Type.Object({
  stage: StageName,
  at: Type.String({ format: 'date-time', description: 'When the stage was published.' }),
  age_seconds: Type.Integer({ minimum: 0, description: 'Seconds since `at`.' }),
  reason: Type.Union([Type.String(), Type.Null()], { description: 'Why a boot failed; null otherwise.' }),
});
export const BootStage = Type.Union([Stage, Type.Null()]);

/** The activation engine's stage is never null (the contract gives `activation_boot` no null): a cold engine's fields are. */
const ActivationStage = Type.Object({
  stage: Type.Union([StageName, Type.Null()], { description: 'As `boot.stage`; null when the activation engine has no fresh stage (not started, or its last boot aged out).' }),
  at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
  age_seconds: Type.Union([Type.Integer({ minimum: 0 }), Type.Null()]),
  reason: Type.Union([Type.String(), Type.Null()]),
});

export const ModelStatus = Type.Object({
  model_id: Type.String(),
  boot: Type.Union([Stage, Type.Null()], {
    description: "Latest fresh cold-boot stage of the model's engine; null when there is none (a cold model whose engine has not been started, or a warm one whose last boot aged out of the idle window).",
  }),
  warm: Type.Boolean({ description: 'Advisory: an engine runner is up (the platform says so), or, when the platform cannot know, a completion was served within the idle window.' }),
  runners: Type.Union([Type.Integer({ minimum: 0 }), Type.Null()], { description: 'Engine runners up now, as the platform counts them; null when it cannot know (an always-on engine at a fixed URL).' }),
  activation_boot: Type.Optional(ActivationStage),
});
export type ModelStatus = Static<typeof ModelStatus>;
type StageValue = Static<typeof Stage>;

export interface ModelStatusSource {
  /** Latest fresh boot stage of the model's engine, or null. */
  boot(modelId: string): StageValue | null;
  /** Advisory warmth and the runner count it comes from. */
  warm(modelId: string): { warm: boolean; runners: number | null };
  /** The activation engine's stage (fields null when none is fresh). */
  activationBoot(modelId: string): Static<typeof ActivationStage>;
}

function stageValue(published: PublishedStage, now: number): StageValue {
  return { stage: published.stage, at: new Date(published.at).toISOString(), age_seconds: Math.max(0, Math.floor((now - published.at) / 1000)), reason: published.reason };
}

/** A stage as the backend streams record it (`BootStagePublished`, read back by the backend service). */
export interface LoggedStage {
  stage: BootStageName;
  at: string;
  reason: string | null;
}

/**
 * Status from each model's platform. A platform that runs its engine here (local-process) knows its
 * stages itself; for one that publishes none here (static), the stage comes from the log, as any
 * process that boots it recorded it (`loggedStage`). A stage is fresh while a boot is under way, or
 * within `freshMs` (the idle window) of being published. The reference engine serves activations from
 * the same process, so its activation stage is its one stage.
 */
export function modelStatusSource(sources: {
  platforms: Map<string, Platform>;
  warm(modelId: string): boolean;
  freshMs: number;
  loggedStage?: (modelId: string, backend: 'completion' | 'activation') => LoggedStage | null;
}): ModelStatusSource {
  const latest = (modelId: string, backend: 'completion' | 'activation'): PublishedStage | null => {
    const platform = sources.platforms.get(modelId);
    if (platform?.kind === 'local-process') return platform.latestStage();
    const logged = sources.loggedStage?.(modelId, backend) ?? null;
    return logged ? { stage: logged.stage, at: Date.parse(logged.at), reason: logged.reason } : null;
  };
  const fresh = (modelId: string, backend: 'completion' | 'activation' = 'completion'): StageValue | null => {
    const published = latest(modelId, backend);
    const now = Date.now();
    if (!published) return null;
    const booting = published.stage !== 'serving' && published.stage !== 'failed';
    return booting || now - published.at < sources.freshMs ? stageValue(published, now) : null;
  };
  return {
    boot: fresh,
    warm: (modelId) => ({ warm: sources.warm(modelId), runners: sources.platforms.get(modelId)?.runners() ?? null }),
    activationBoot: (modelId) =>
      (sources.platforms.get(modelId)?.kind === 'local-process' ? fresh(modelId) : fresh(modelId, 'activation')) ?? { stage: null, at: null, age_seconds: null, reason: null },
  };
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
    const { warm, runners } = source.warm(id);
    const body: ModelStatus = { model_id: id, boot: source.boot(id), warm, runners, ...(model.activations ? { activation_boot: source.activationBoot(id) } : {}) };
    return body;
  });
}
