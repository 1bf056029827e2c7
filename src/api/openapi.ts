import type { FastifyInstance } from 'fastify';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import { Type, type TSchema } from 'typebox';
import { errorCatalogue } from '../errors/index.ts';
import { CompletionRequest } from '../completion-request/index.ts';
import { HealthBody } from './health.ts';
import { ModelList } from './models.ts';
import { ModelStatus } from './model-status.ts';

export const interfaceVersion = '0.1.0';

const plain = (schema: TSchema): Record<string, unknown> => JSON.parse(JSON.stringify(schema));

const ErrorEnvelope = Type.Object({
  error: Type.Object(
    {
      code: Type.String({ description: 'Stable error code; clients branch on it.' }),
      message: Type.String(),
      type: Type.String(),
    },
    { additionalProperties: true, description: 'Extra tagged fields appear where useful, e.g. upstream_status, retry_after_seconds, param.' },
  ),
  request_id: Type.String({ description: 'Equal to the X-Request-Id header.' }),
});

const ValidationError = Type.Object({
  detail: Type.Array(
    Type.Object({
      loc: Type.Array(Type.Union([Type.String(), Type.Integer()])),
      msg: Type.String(),
      type: Type.String(),
      input: Type.Optional(Type.Unknown()),
      ctx: Type.Optional(Type.Object({}, { additionalProperties: true })),
    }),
  ),
});

const header = (description: string, schema: Record<string, unknown> = { type: 'string' }) => ({ description, schema });
const commonHeaders = {
  'X-Request-Id': header('Trace id, present on every response.'),
};
const upstreamHeaders = {
  'X-Svc-Upstream-Model': header('Backend (checkpoint) that served or failed the request.'),
  'X-Svc-Upstream-Gpu': header('GPU shape of that backend.'),
};
const errorHeaders = {
  ...commonHeaders,
  ...upstreamHeaders,
  'X-Svc-Upstream-Error-Kind': header('On upstream-error 4xx/5xx; mirrors error.code.'),
  'Retry-After': header('Seconds to wait; on retryable 429, 502 and 503.', { type: 'integer' }),
  'X-Should-Retry': header('"false" on responses a retry cannot fix (413, 400 deadline_infeasible, 504).'),
};

/** One response per error status, listing the codes the catalogue maps to it. */
function errorResponses(statuses: number[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const status of statuses) {
    const codes = Object.entries(errorCatalogue).filter(([, e]) => e.status === status).map(([code]) => code);
    out[String(status)] = {
      description: `Error envelope; error.code one of: ${codes.join(', ')}`,
      headers: errorHeaders,
      content: { 'application/json': { schema: { $ref: '#/components/schemas/ErrorEnvelope' } } },
    };
  }
  return out;
}

const completionErrorStatuses = [400, 401, 403, 404, 413, 429, 500, 502, 503, 504];

export function openApiDocument(): Record<string, unknown> {
  const json = (ref: string) => ({ 'application/json': { schema: { $ref: `#/components/schemas/${ref}` } } });
  return {
    openapi: '3.1.0',
    info: {
      title: 'Base-Model Text Completion Service',
      version: interfaceVersion,
      description: 'Raw text completion against base models, logprobs, residual-stream capture and steering. No chat endpoint.',
    },
    components: {
      securitySchemes: { bearer: { type: 'http', scheme: 'bearer' } },
      schemas: {
        CompletionRequest: plain(CompletionRequest),
        ErrorEnvelope: plain(ErrorEnvelope),
        HealthBody: plain(HealthBody),
        ModelList: plain(ModelList),
        ModelStatus: plain(ModelStatus),
        HTTPValidationError: plain(ValidationError),
      },
    },
    paths: {
      '/health': {
        get: {
          summary: 'Aggregated health',
          responses: {
            200: { description: 'Health body (also when degraded)', headers: commonHeaders, content: json('HealthBody') },
            503: { description: 'The service cannot serve (its database is down)', headers: commonHeaders, content: json('HealthBody') },
          },
        },
      },
      '/v1/models': {
        get: {
          summary: 'Live models with capabilities',
          security: [{ bearer: [] }],
          responses: { 200: { description: 'Model list', headers: commonHeaders, content: json('ModelList') }, ...errorResponses([401, 500]) },
        },
      },
      '/v1/models/{model_id}/status': {
        get: {
          summary: 'Per-model warm/cold and boot-stage status',
          security: [{ bearer: [] }],
          parameters: [{ name: 'model_id', in: 'path', required: true, schema: { type: 'string' } }],
          responses: {
            200: { description: 'Model status', headers: commonHeaders, content: json('ModelStatus') },
            ...errorResponses([400, 401, 404, 500]),
            422: {
              description: 'Validation error schema (documented for compatibility; the API answers 400 invalid_request in the error envelope instead)',
              headers: commonHeaders,
              content: json('HTTPValidationError'),
            },
          },
        },
      },
      '/v1/completions': {
        post: {
          summary: 'Raw text completion',
          security: [{ bearer: [] }],
          parameters: [
            { name: 'X-Svc-Workload', in: 'header', required: false, schema: { type: 'string', enum: ['interactive', 'batch'] }, description: 'Telemetry only.' },
          ],
          requestBody: { required: true, content: json('CompletionRequest') },
          responses: {
            200: {
              description: 'A text_completion object, or an SSE stream when `stream` is true',
              headers: {
                ...commonHeaders,
                ...upstreamHeaders,
                'X-Svc-Max-Tokens-Clamped': header('requested=N,applied=M,reason=budget|deadline|deadline+budget,source=client|default'),
              },
              content: {
                'application/json': { schema: { type: 'object', description: 'text_completion object, passed through from the engine' } },
                'text/event-stream': { schema: { type: 'string', description: 'data: <text_completion chunk> frames, ended by data: [DONE]' } },
              },
            },
            ...errorResponses(completionErrorStatuses),
          },
        },
      },
      '/v1/chat/completions': {
        post: {
          summary: 'Not supported: always 400 chat_completions_unsupported',
          responses: errorResponses([400]),
        },
      },
    },
  };
}

export async function openApiRoutes(app: FastifyInstance): Promise<void> {
  const document = openApiDocument();
  const body = JSON.stringify(document);
  app.get('/openapi.json', async (_request, reply) => reply.type('application/json; charset=utf-8').send(body));
  await app.register(swagger, { mode: 'static', specification: { document: document as never } });
  await app.register(swaggerUi, { routePrefix: '/swagger', uiConfig: { url: '/openapi.json' } as never });
}
