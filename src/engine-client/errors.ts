import { apiError, type ApiError } from '../errors/index.ts';

/** What an engine said when it failed, in either of vLLM's error shapes. */
export interface EngineFailure {
  status: number;
  message: string;
  type: string | null;
  param: string | null;
}

export function parseEngineError(status: number, text: string): EngineFailure {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return { status, message: text.slice(0, 500), type: null, param: null };
  }
  // Current vLLM nests under `error`; older versions answer a flat `{object: "error", ...}`.
  const obj = (parsed as { error?: unknown })?.error ?? parsed;
  const e = (typeof obj === 'object' && obj !== null ? obj : {}) as Record<string, unknown>;
  return {
    status,
    message: typeof e.message === 'string' ? e.message : '',
    type: typeof e.type === 'string' ? e.type : null,
    param: typeof e.param === 'string' ? e.param : null,
  };
}

// Parameters vLLM names when it refuses a request for its context limit.
const contextParams = new Set(['input_tokens', 'max_tokens']);

/** Whether a failure is worth one more try on the same engine (the engine may recover); OOM and death are not. */
export function isRetryable(failure: EngineFailure): boolean {
  return failure.status >= 500 && kindOf(failure) === 'upstream_server_error';
}

function kindOf(failure: EngineFailure): 'engine_oom' | 'engine_engine_dead' | 'upstream_server_error' {
  const type = failure.type ?? '';
  if (failure.status === 503 || /EngineDead/i.test(type)) return 'engine_engine_dead';
  // vLLM reports OOM as a 500 whose type names the exception; older builds only say it in the message.
  if (/OutOfMemory|OOM/i.test(type) || /out of memory/i.test(failure.message)) return 'engine_oom';
  return 'upstream_server_error';
}

/** Maps an engine's error response to our catalogue; the engine's own message is kept for 4xx only. */
export function engineErrorToApiError(failure: EngineFailure, upstreamHeaders: Record<string, string>): ApiError {
  // Extras travel inside vllm_xargs; the client knows them as top-level fields.
  const param = failure.param?.replace(/^vllm_xargs\./, '') ?? null;
  const fields = { upstream_status: failure.status, ...(param ? { param } : {}) };
  const options = { fields, headers: upstreamHeaders };
  if (failure.status === 400 || failure.status === 422) {
    const code = failure.param && contextParams.has(failure.param) ? 'engine_context_length' : 'engine_invalid_request';
    return apiError(code, `the engine rejected the request: ${failure.message || 'bad request'}`, options);
  }
  if (failure.status >= 500) {
    const kind = kindOf(failure);
    const message = {
      engine_oom: 'the model server ran out of GPU memory',
      engine_engine_dead: 'the model server engine has died',
      upstream_server_error: `the model server failed with status ${failure.status}`,
    }[kind];
    return apiError(kind, message, options);
  }
  return apiError('upstream_server_error', `the model server answered status ${failure.status}`, options);
}

/**
 * What an engine call's error says about the backend, for its circuit breaker: the kind of failure
 * that counts against it (unreachable, a 5xx after retries, out of memory, engine dead, a generation
 * that outran the request window), `answered` when the engine was up and refused the request (a 4xx:
 * the request's fault, never the engine's), or null when nothing was learnt (the client left, the
 * gateway refused it first).
 */
export function backendOutcomeOf(error: unknown): string | 'answered' | null {
  const code = (error as ApiError | null)?.code;
  switch (code) {
    case 'upstream_unreachable':
    case 'upstream_server_error':
    case 'engine_oom':
    case 'engine_engine_dead':
      return code;
    case 'upstream_deadline':
      return 'timeout';
    case 'engine_invalid_request':
    case 'engine_context_length':
    case 'capture_incomplete':
      return 'answered';
    default:
      return null;
  }
}
