// Route schemas: TypeBox schemas on each route validate its request (compiled once, at registration)
// and are what the OpenAPI document is generated from, so the two cannot drift.
import type { FastifySchemaCompiler } from 'fastify';
import { Type, type TSchema } from 'typebox';
import { Compile } from 'typebox/compile';
import { apiError, codesAnsweredWith, type ApiError } from '../errors/index.ts';

/** Routes whose schema carries this tag are documented in the admin document, never in `/openapi.json`. */
export const adminTag = 'admin';

/** Public routes that need an API key (`security` of a route schema). */
export const apiKeySecurity = [{ apiKey: [] }];
/** Admin routes (`security` of a route schema, beside `tags: [adminTag]`). */
export const adminSecurity = [{ adminToken: [] }];

interface SchemaError {
  keyword: string;
  instancePath: string;
  message: string;
  params: Record<string, unknown>;
}

/** `model_id: must match ...`, `body.email: ...`: the part of the request and the field, then the problem. */
function describe(httpPart: string, error: SchemaError | undefined): string {
  if (!error) return `${httpPart}: is invalid`;
  const path = error.instancePath.split('/').slice(1);
  const missing = (error.params as { requiredProperties?: string[] }).requiredProperties?.[0];
  const unknown = (error.params as { additionalProperties?: string[] }).additionalProperties?.[0];
  if (unknown ?? missing) path.push((unknown ?? missing)!);
  // Path and query parameters and headers are known by their own names; body fields by `body.<field>`.
  const where = httpPart === 'body' ? ['body', ...path] : path.length > 0 ? path : [httpPart];
  return `${where.join('.')}: ${unknown ? 'unknown field' : missing ? 'is required' : error.message}`;
}

/**
 * Fastify's validator compiler for every route: the TypeBox schema is compiled once, and a request that
 * fails it is a 400 `invalid_request` in the error envelope naming the field (never fastify's own
 * validation error or a `detail` array).
 */
export const compileRouteSchema: FastifySchemaCompiler<TSchema> = ({ schema, httpPart }) => {
  const check = Compile(schema);
  return (value: unknown) => {
    if (check.Check(value)) return true;
    // `boolean` errors ("schema is false") restate an additionalProperties error that names the field.
    const first = (check.Errors(value) as SchemaError[]).find((e) => e.keyword !== 'boolean');
    return { error: apiError('invalid_request', describe(httpPart ?? 'request', first)) as ApiError };
  };
};

/** Responses keep the plain JSON serializer: response schemas document bodies that are passed through as they are. */
export const serializeAsJson = () => (data: unknown) => JSON.stringify(data);

export const ErrorEnvelope = Type.Object(
  {
    error: Type.Object(
      {
        code: Type.String({ description: 'Stable error code; clients branch on it.' }),
        message: Type.String(),
        type: Type.String(),
      },
      { additionalProperties: true, description: 'Extra tagged fields appear where useful, e.g. upstream_status, retry_after_seconds, param.' },
    ),
    request_id: Type.String({ description: 'Equal to the X-Request-Id header.' }),
  },
  { $id: 'ErrorEnvelope', description: 'The error envelope of every error response.' },
);

/** Listed because the contract's description lists it; the API answers 400 `invalid_request` in the envelope instead. */
export const HTTPValidationError = Type.Object(
  {
    detail: Type.Array(
      Type.Object({
        loc: Type.Array(Type.Union([Type.String(), Type.Integer()])),
        msg: Type.String(),
        type: Type.String(),
        input: Type.Optional(Type.Unknown()),
        ctx: Type.Optional(Type.Object({}, { additionalProperties: true })),
      }),
    ),
  },
  { $id: 'HTTPValidationError' },
);

/** Shared schemas (components of the document); add them to the app before any route refers to them. */
export const sharedSchemas = [ErrorEnvelope, HTTPValidationError];

const requestIdHeader = { 'X-Request-Id': Type.String({ description: 'Trace id, present on every response.' }) };
const upstreamHeaders = {
  'X-Svc-Upstream-Model': Type.String({ description: 'Backend (checkpoint) that served or failed the request.' }),
  'X-Svc-Upstream-Gpu': Type.String({ description: 'GPU shape of that backend.' }),
};
const errorHeaders = {
  ...requestIdHeader,
  ...upstreamHeaders,
  'X-Svc-Upstream-Error-Kind': Type.String({ description: 'On upstream-error 4xx/5xx; mirrors error.code.' }),
  'Retry-After': Type.Integer({ description: 'Seconds to wait; on retryable 429, 502 and 503.' }),
  'X-Should-Retry': Type.String({ description: '"false" on responses a retry cannot fix (413, 400 deadline_infeasible, 504) and on a 429 whose Retry-After is over 60 seconds.' }),
};

interface OkOptions {
  /** The response names its backend (X-Svc-Upstream-Model, X-Svc-Upstream-Gpu). */
  upstream?: boolean;
  headers?: Record<string, TSchema>;
  /** Media types beside JSON, or instead of it (e.g. `text/event-stream`). */
  content?: Record<string, { schema: TSchema }>;
}

/** A success response: its body schema and headers (X-Request-Id always, the upstream ones when `upstream`). */
export function okResponse(description: string, schema: TSchema, options: OkOptions = {}) {
  return {
    description,
    headers: { ...requestIdHeader, ...(options.upstream ? upstreamHeaders : {}), ...options.headers },
    content: { 'application/json': { schema }, ...options.content },
  };
}

/** Statuses any route may answer before it sees the request: Node's parser refused it (malformed, too slow, headers too large). */
const beforeRouting = [400, 408, 431];

/**
 * One response per error status: the envelope, the catalogue's codes for that status, and the error
 * headers. Every route's list ends with the statuses answered before routing.
 */
export function errorResponses(...statuses: number[]): Record<number, unknown> {
  const out: Record<number, unknown> = {};
  // A route that authenticates may refuse an address with too many failed authentications (429 rate_limited).
  const authenticated = statuses.includes(401) ? [429] : [];
  for (const status of new Set([...statuses, ...authenticated, ...beforeRouting])) {
    const codes = codesAnsweredWith(status);
    out[status] = {
      description: `Error envelope; error.code one of: ${codes.join(', ')}`,
      headers: errorHeaders,
      content: { 'application/json': { schema: Type.Ref('ErrorEnvelope') } },
    };
  }
  return out;
}

/** The contract's 422 entry: documented, never answered (a malformed parameter is 400 in the envelope). */
export const validationErrorResponse = {
  422: {
    description: 'Validation error schema (documented for compatibility; the API answers 400 invalid_request in the error envelope instead)',
    headers: requestIdHeader,
    content: { 'application/json': { schema: Type.Ref('HTTPValidationError') } },
  },
};
