/** The one place meter rejections (the decider's values) become the contract's errors. */
import { apiError, ApiError } from '../errors/index.ts';
import type { MeterRejection } from '../../deciders/index.ts';
import type { Refusal } from './types.ts';

export function rejectionToApiError(rejection: MeterRejection): ApiError {
  switch (rejection.rejected) {
    case 'key_inactive':
      return apiError('invalid_api_key', `the API key is ${String(rejection.details?.status ?? 'not active')}`, { status: 403 });
    case 'rate_limited':
      return apiError('rate_limited', rejection.message, { retryAfter: Number(rejection.details?.retry_after_seconds ?? 1) });
    case 'budget_exceeded':
      return apiError('budget_exceeded', rejection.message, { fields: { budget: rejection.details?.budget }, retryAfter: Number(rejection.details?.retry_after_seconds ?? 60) });
    case 'at_capacity':
    case 'queue_full':
      return apiError('queue_full', rejection.message);
    case 'duplicate_request':
      return apiError('invalid_request', 'X-Request-Id is already in use by a running request of this key');
    case 'meter_not_opened':
    case 'meter_closed':
      return new ApiError('internal_error', 'internal error');
  }
}

/** Which limit each refusal of a limit names in the log (a budget names itself). */
const limitOf: Partial<Record<string, string>> = { rate_limited: 'per_minute', queue_full: 'max_queued', spend_cap: 'spend_cap' };

/**
 * What a refused request's record says refused it: the budget (`error.budget`) or limit, and the
 * Retry-After the client was given. Any other refusal (validation, a paused key, ...) names none.
 */
export function refusalOf(error: ApiError): Refusal {
  const retryAfter = error.headers['retry-after'];
  const budget = error.code === 'budget_exceeded' && typeof error.fields.budget === 'string' ? error.fields.budget : null;
  return { refusedBy: budget ?? limitOf[error.code] ?? null, retryAfterSeconds: retryAfter === undefined ? null : Number.parseInt(retryAfter, 10) };
}
