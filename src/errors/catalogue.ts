/**
 * The error catalogue: every error the service returns is defined here once, with its status, type and
 * headers. Routes throw `ApiError`s built from these codes; the error handler renders the envelope.
 */

interface CatalogueEntry {
  status: number;
  type: string;
  /** `Retry-After` seconds for retryable errors; a caller may override per error. */
  retryAfter?: number;
  /** `X-Should-Retry: false` for errors a retry cannot fix (a 429 also gets it when its wait is too long, see below). */
  noRetry?: boolean;
  /** Upstream errors mirror their code in `X-Svc-Upstream-Error-Kind`. */
  upstream?: boolean;
  /** Other statuses the contract gives this code in named situations (a caller picks one with `status`). */
  otherStatuses?: readonly number[];
}

/**
 * A 429 whose `Retry-After` is longer than this also says `X-Should-Retry: false`: SDKs (openai's among
 * them) sleep whatever `Retry-After` says before retrying, and a month's reset is not worth a client's
 * sleep. `Retry-After` stays, so a client that schedules its own retry still knows when.
 */
const longestClientWaitSeconds = 60;

export const errorCatalogue = {
  // 408 and 431 when Node's HTTP parser refuses the request before any route sees it (too slow, headers too large).
  invalid_request: { status: 400, type: 'invalid_request_error', otherStatuses: [408, 431] },
  context_length_exceeded: { status: 400, type: 'invalid_request_error' },
  deadline_infeasible: { status: 400, type: 'invalid_request_error', noRetry: true },
  chat_completions_unsupported: { status: 400, type: 'invalid_request_error' },
  model_not_found: { status: 400, type: 'invalid_request_error' },
  bad_json: { status: 400, type: 'invalid_request_error' },
  full_vocab_prompt_too_long: { status: 400, type: 'invalid_request_error' },
  activations_unsupported: { status: 400, type: 'invalid_request_error' },
  activation_prompt_too_long: { status: 400, type: 'invalid_request_error' },
  engine_context_length: { status: 400, type: 'invalid_request_error', upstream: true },
  engine_invalid_request: { status: 400, type: 'invalid_request_error', upstream: true },
  // 403 when the key was found paused or revoked at the reservation re-check, after authentication.
  invalid_api_key: { status: 401, type: 'authentication_error', otherStatuses: [403] },
  not_found: { status: 404, type: 'not_found_error' },
  harvest_job_not_found: { status: 404, type: 'not_found_error' },
  harvest_shard_not_found: { status: 404, type: 'not_found_error' },
  harvest_stats_not_found: { status: 404, type: 'not_found_error' },
  harvest_not_cancellable: { status: 409, type: 'invalid_request_error' },
  key_revoked: { status: 409, type: 'invalid_request_error' },
  method_not_allowed: { status: 405, type: 'invalid_request_error' },
  request_too_large: { status: 413, type: 'invalid_request_error', noRetry: true },
  budget_exceeded: { status: 429, type: 'rate_limit_error', retryAfter: 60 },
  spend_cap: { status: 429, type: 'rate_limit_error', retryAfter: 3600 },
  queue_full: { status: 429, type: 'rate_limit_error', retryAfter: 1 },
  rate_limited: { status: 429, type: 'rate_limit_error', retryAfter: 1 },
  harvest_quota_exceeded: { status: 429, type: 'rate_limit_error', retryAfter: 3600 },
  harvest_concurrency_exceeded: { status: 429, type: 'rate_limit_error', retryAfter: 30 },
  upstream_unreachable: { status: 502, type: 'upstream_error', retryAfter: 5, upstream: true },
  capture_incomplete: { status: 502, type: 'upstream_error', retryAfter: 5, upstream: true },
  engine_oom: { status: 502, type: 'upstream_error', retryAfter: 10, upstream: true },
  engine_engine_dead: { status: 502, type: 'upstream_error', retryAfter: 10, upstream: true },
  upstream_server_error: { status: 502, type: 'upstream_error', retryAfter: 5, upstream: true },
  wrapper_saturated: { status: 503, type: 'server_error', retryAfter: 5 },
  store_unavailable: { status: 503, type: 'server_error', retryAfter: 5 },
  platform_cold_boot: { status: 503, type: 'upstream_error', retryAfter: 30, upstream: true },
  circuit_open: { status: 503, type: 'upstream_error', retryAfter: 30, upstream: true },
  tokenizer_unavailable: { status: 503, type: 'server_error', retryAfter: 10 },
  harvest_unavailable: { status: 503, type: 'server_error', retryAfter: 10 },
  // The harvest storage (SVC_HARVEST_DIR) has no space left: a submit is refused; a running job fails with this code.
  harvest_storage_full: { status: 503, type: 'server_error', retryAfter: 300 },
  upstream_deadline: { status: 504, type: 'upstream_error', noRetry: true, upstream: true },
  internal_error: { status: 500, type: 'server_error' },
} as const satisfies Record<string, CatalogueEntry>;

export type ErrorCode = keyof typeof errorCatalogue;

/** Every code the service may answer with `status`: its usual status or one of its `otherStatuses`. */
export function codesAnsweredWith(status: number): ErrorCode[] {
  return (Object.entries(errorCatalogue) as [ErrorCode, CatalogueEntry][]).filter(([, e]) => e.status === status || e.otherStatuses?.includes(status)).map(([code]) => code);
}

export interface ApiErrorOptions {
  /** Extra tagged fields inside `error` (e.g. `upstream_status`, `retry_after_seconds`, `param`). */
  fields?: Record<string, unknown>;
  /** Overrides the catalogue's Retry-After seconds. */
  retryAfter?: number;
  headers?: Record<string, string>;
  /** One of the entry's `otherStatuses` instead of its usual status. */
  status?: number;
}

export class ApiError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly type: string;
  readonly fields: Record<string, unknown>;
  readonly headers: Record<string, string>;

  constructor(code: ErrorCode, message: string, options: ApiErrorOptions = {}) {
    super(message);
    const entry: CatalogueEntry = errorCatalogue[code];
    this.code = code;
    if (options.status !== undefined && !entry.otherStatuses?.includes(options.status)) throw new RangeError(`${code} is never answered with status ${options.status}`);
    this.status = options.status ?? entry.status;
    this.type = entry.type;
    this.fields = options.fields ?? {};
    this.headers = { ...options.headers };
    const retryAfter = options.retryAfter ?? entry.retryAfter;
    if (retryAfter !== undefined) this.headers['retry-after'] = String(retryAfter);
    if (entry.noRetry || (this.status === 429 && retryAfter !== undefined && retryAfter > longestClientWaitSeconds)) this.headers['x-should-retry'] = 'false';
    if (entry.upstream) this.headers['x-svc-upstream-error-kind'] = code;
  }

  /** The contract's envelope. */
  body(requestId: string): { error: Record<string, unknown>; request_id: string } {
    return { error: { code: this.code, message: this.message, type: this.type, ...this.fields }, request_id: requestId };
  }
}

export const apiError = (code: ErrorCode, message: string, options?: ApiErrorOptions): ApiError => new ApiError(code, message, options);
