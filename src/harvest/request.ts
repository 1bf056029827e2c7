/**
 * A harvest submit's request checks, in the contract's order (prompt count, estimated tokens, then
 * the model and its layers), and the job they plan; and the answer to a refused admission. Nothing
 * here reads or writes the store.
 */
import { randomBytes } from 'node:crypto';
import { apiError, type ApiError } from '../errors/index.ts';
import type { HarvestSettings } from '../config/index.ts';
import type { ModelRegistry } from '../registry/index.ts';
import type { HarvestSubmittedData } from '../../events/index.ts';
import { secondsUntilUtcTurn, utcMonth } from '../../events/shapes.ts';
import { estimateTokens } from './estimate.ts';
import type { HarvestCaller, HarvestRequest } from './types.ts';

export const newHarvestJobId = (): string => `hj_${randomBytes(15).toString('hex').slice(0, 24)}`;

/** Where a harvest job's id may come from: what `newHarvestJobId` makes (anything else is a 404, never a store read). */
export const harvestJobIdPattern = '^hj_[0-9a-z]{24}$';

/** The job a request plans, all but its stored input's hash; throws the contract's 400 for a request over a cap. */
export function plannedJob(
  caller: HarvestCaller,
  request: HarvestRequest,
  options: { settings: HarvestSettings; registry: ModelRegistry; jobId: string; now: Date },
): Omit<HarvestSubmittedData, 'input_sha256'> {
  const { settings, registry, jobId, now } = options;
  if (request.prompts.length > settings.maxPrompts) {
    throw invalid('prompts', `prompts: ${request.prompts.length} prompts exceed the cap of ${settings.maxPrompts} per job`);
  }
  const estimatedTokens = estimateTokens(request.prompts);
  if (estimatedTokens > settings.maxEstimatedTokens) {
    throw invalid('prompts', `prompts: about ${estimatedTokens} tokens (characters / 4) exceed the cap of ${settings.maxEstimatedTokens} per job`);
  }
  const model = registry.resolve(request.model);
  const activations = model.activations;
  if (!activations) throw apiError('activations_unsupported', `model ${model.id} has no activation engine: it cannot be harvested`, { fields: { param: 'model' } });
  const shardSize = request.shard_size ?? 32;
  return {
    job_id: jobId,
    key_id: caller.keyId,
    key_prefix: caller.prefix,
    user_id: caller.userId,
    model: model.id,
    checkpoint: model.checkpoint,
    prompt_count: request.prompts.length,
    estimated_tokens: estimatedTokens,
    layers: resolveLayers(request.layers ?? null, activations.n_layers),
    d_model: activations.d_model ?? model.architecture?.d_model ?? null,
    shard_size: shardSize,
    batch_size: request.batch_size ?? settings.defaultBatchSize,
    shard_count: Math.ceil(request.prompts.length / shardSize),
    month: utcMonth(now),
    at: now.toISOString(),
  };
}

function invalid(param: string, message: string): ApiError {
  return apiError('invalid_request', message, { fields: { param } });
}

/** `layers`: a list (ascending, distinct, each below the model's layer count when known), or every layer for `"all"` and null. */
export function resolveLayers(layers: number[] | 'all' | null, nLayers: number | null): number[] {
  if (layers === null || layers === 'all') {
    if (nLayers === null) throw invalid('layers', `layers: the model's layer count is not configured, so "all" cannot be resolved; list the layers`);
    return Array.from({ length: nLayers }, (_, i) => i);
  }
  if (layers.length === 0) throw invalid('layers', 'layers: must list at least one layer (or be "all" or null)');
  const sorted = [...new Set(layers)].sort((a, b) => a - b);
  const beyond = nLayers === null ? undefined : sorted.find((l) => l >= nLayers);
  if (beyond !== undefined) throw invalid('layers', `layers: layer ${beyond} is out of range; the model has ${nLayers} layers (0-${nLayers! - 1})`);
  return sorted;
}

/** The answer to an admission its key's quota stream refused: 429 with Retry-After to the next UTC month, or the running cap's 429. */
export function admissionRefused(rejection: { rejected: string; message: string; details?: Record<string, unknown> }, now: Date): ApiError {
  if (rejection.rejected === 'harvest_quota_exceeded') {
    return apiError('harvest_quota_exceeded', rejection.message, { retryAfter: secondsUntilUtcTurn(now.getTime(), 'month'), fields: rejection.details });
  }
  if (rejection.rejected === 'harvest_concurrency_exceeded') return apiError('harvest_concurrency_exceeded', rejection.message, { fields: rejection.details });
  return apiError('internal_error', 'the harvest admission was refused unexpectedly');
}
