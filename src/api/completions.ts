// POST /v1/completions, as the list of its steps (src/api/completion/), and POST /v1/chat/completions (always refused).
import type { FastifyInstance, FastifySchemaCompiler } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type, type TSchema } from 'typebox';
import { apiError } from '../errors/index.ts';
import { WriteOrder } from './write-order.ts';
import { CompletionRequest, completionRequestError } from '../completion-request/index.ts';
import { apiKeySecurity, compileRouteSchema, errorResponses, okResponse } from './route-schema.ts';
import { EngineContextLengths } from './engine-context.ts';
import { CompletionCall, type CompletionRoute, type CompletionRouteOptions } from './completion/call.ts';
import { awaitColdBoot, checkBreaker, preflight, reserve, resolveModel, validate } from './completion/steps.ts';
import { callEngine } from './completion/engine-call.ts';
import { relay } from './completion/relay.ts';

export type { CompletionRouteOptions, RequestKey } from './completion/call.ts';

const completionSchema = {
  summary: 'Raw text completion',
  security: apiKeySecurity,
  body: CompletionRequest,
  headers: Type.Object({
    'x-svc-workload': Type.Optional(Type.String({ description: '`interactive` or `batch`: telemetry only; other values are ignored, never refused.' })),
  }),
  response: {
    200: okResponse(
      'A text_completion object, or an SSE stream when `stream` is true',
      Type.Object({}, { additionalProperties: true, description: 'text_completion object, passed through from the engine' }),
      {
        upstream: true,
        headers: { 'X-Svc-Max-Tokens-Clamped': Type.String({ description: 'requested=N,applied=M,reason=budget|deadline|deadline+budget,source=client|default' }) },
        content: { 'text/event-stream': { schema: Type.String({ description: 'data: <text_completion chunk> frames, ended by data: [DONE]' }) } },
      },
    ),
    ...errorResponses(400, 401, 403, 404, 413, 429, 500, 502, 503, 504),
  },
};

/** The body is judged by the completion-request schema's own check, whose messages name the field. */
const validateCompletion: FastifySchemaCompiler<TSchema> = (route) =>
  route.httpPart === 'body'
    ? (body: unknown) => {
        const error = completionRequestError(body);
        return error ? { error } : true;
      }
    : compileRouteSchema(route);

export function completionRoutes(app: FastifyInstance, options: CompletionRouteOptions): void {
  const shared: CompletionRoute = {
    options,
    writeOrder: new WriteOrder(),
    contextLengths: new EngineContextLengths(options.engines, (id) => options.coldBoots?.platformOf(id)?.ensureRunning()?.ready ?? null),
  };

  // attachValidation: a body the schema refuses is still recorded as a refused request, then answered.
  const route = { schema: completionSchema, validatorCompiler: validateCompletion, onRequest: options.authenticate, attachValidation: true };
  app.withTypeProvider<TypeBoxTypeProvider>().post('/v1/completions', route, async (request, reply) => {
    // Each step answers its own refusals (recorded, then thrown); false: the client left, nothing to answer.
    const call = new CompletionCall(request, reply, shared);
    const body = validate(call);
    const model = resolveModel(call, body);
    await preflight(call, body, model);
    await checkBreaker(call);
    if (!(await awaitColdBoot(call))) return reply;
    if (!(await reserve(call))) return reply;
    const upstream = await callEngine(call); // settles the request when the call fails
    if (!upstream) return reply;
    return relay(call, upstream); // settles the request once the response is over
  });

  // Always refused, whatever the body: parse nothing, point callers to /v1/completions.
  app.register(async (scope) => {
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser('*', (_request, payload, done) => {
      payload.resume();
      payload.once('end', () => done(null, undefined));
      payload.once('error', () => done(null, undefined));
    });
    const schema = { summary: 'Not supported: always 400 chat_completions_unsupported', response: errorResponses(400) };
    // "Any call": every method (a GET too), not 405. OPTIONS stays CORS's preflight.
    scope.route({
      method: ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE'],
      url: '/v1/chat/completions',
      bodyLimit: Number.MAX_SAFE_INTEGER,
      schema,
      handler: async () => {
        throw apiError('chat_completions_unsupported', 'chat completions are not supported: these are base models and prompts are never templated; send raw text to POST /v1/completions');
      },
    });
  });
}
