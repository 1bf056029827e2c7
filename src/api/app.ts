import Fastify, { LogController, type FastifyInstance, type FastifyRequest } from 'fastify';
import cors from '@fastify/cors';
import type { Logger } from 'pino';
import { apiError } from '../errors/index.ts';
import { requestIdFor } from './request-id.ts';
import { logWhenEnded } from './request-log.ts';
import { badJson, maxBodyBytes, notJson } from './body.ts';
import { answerClientError, installErrorHandling, sendApiError, toApiError } from './error-handler.ts';
import { healthRoute, type HealthSources } from './health.ts';
import { compileRouteSchema, serializeAsJson } from './route-schema.ts';
import { registerOpenApi } from './openapi.ts';
import { installCompression } from './compression.ts';
import { MAX_SEED, withExactSeed } from '../completion-request/index.ts';
import { OFF_THREAD_JSON_BYTES } from '../tokenizer/index.ts';

export const exposedHeaders = [
  'X-Request-Id',
  'Retry-After',
  'X-Should-Retry',
  'X-Svc-Upstream-Model',
  'X-Svc-Upstream-Gpu',
  'X-Svc-Upstream-Error-Kind',
  'X-Svc-Max-Tokens-Clamped',
  'X-Svc-Longpoll',
];

export interface AppOptions {
  logger: Logger;
  health: HealthSources;
  /** Parses a JSON body above OFF_THREAD_JSON_BYTES off the event loop (the tokenizer pool); absent: in place. */
  parseLargeJson?: (bytes: Uint8Array) => Promise<unknown>;
  /** Registers the feature routes (completions, models, ...) on the app. */
  routes?: (app: FastifyInstance) => void | Promise<void>;
  /** Bounds on receiving a request (Settings.http); without them, 30 s for the headers and 5 minutes in all. */
  timeouts?: { headersTimeoutMs: number; requestTimeoutMs: number };
  /** Proxies whose X-Forwarded-For names the client (request.ip); none: the peer is the client. */
  trustedProxies?: string[];
}

/** The longest path parameter the router takes; longer ones are 400 before any route sees them. */
const maxParamLength = 2048;

/**
 * Node's server checks its connections against the bounds on a timer (30 s by default): a fraction of
 * the smaller bound, so a request past it is answered within about a quarter of that bound more.
 */
function connectionsCheckingInterval(timeouts: { headersTimeoutMs: number; requestTimeoutMs: number }): number {
  return Math.min(30_000, Math.max(50, Math.floor(Math.min(timeouts.headersTimeoutMs, timeouts.requestTimeoutMs) / 4)));
}

/** Fastify's own request lines are off: request-log.ts writes one per request when it ends. */
class MetadataLogController extends LogController {
  constructor() {
    super({ requestIdLogLabel: 'request_id' });
  }

  override incomingRequest(): void {}

  override routeNotFound(): void {}

  override requestCompleted(): void {}
}

/**
 * The HTTP surface: request ids, the error envelope, CORS, body limits, metadata-only logging, route
 * schemas (validation and the generated OpenAPI document at /openapi.json, UI at /swagger).
 */
export async function buildApp(options: AppOptions): Promise<FastifyInstance> {
  const timeouts = options.timeouts ?? { headersTimeoutMs: 30_000, requestTimeoutMs: 300_000 };
  const app = Fastify({
    // A client that sends its headers or body too slowly (one byte of an announced 8 MB) is answered 408
    // and its connection closed (answerClientError), rather than holding it open for ever.
    requestTimeout: timeouts.requestTimeoutMs,
    // request.ip (the client the failed-authentication limit counts) is X-Forwarded-For's only behind these.
    trustProxy: options.trustedProxies && options.trustedProxies.length > 0 ? options.trustedProxies.join(',') : false,
    http: { headersTimeout: timeouts.headersTimeoutMs, requestTimeout: timeouts.requestTimeoutMs, connectionsCheckingInterval: connectionsCheckingInterval(timeouts) },
    loggerInstance: options.logger,
    logController: new MetadataLogController(),
    genReqId: requestIdFor,
    requestIdHeader: false,
    bodyLimit: maxBodyBytes,
    return503OnClosing: false,
    forceCloseConnections: 'idle',
    // Long path parameters reach our own validation (400) instead of the router's limit.
    routerOptions: { ignoreTrailingSlash: true, maxParamLength },
    clientErrorHandler: answerClientError,
    frameworkErrors: (err, request, reply) => {
      reply.header('x-request-id', request.id);
      logWhenEnded(request, reply);
      // A malformed path parameter is 400 invalid_request (the contract), a path parameter longer than the
      // router takes (find-my-way's 414) included.
      const error =
        err.code === 'FST_ERR_BAD_URL'
          ? apiError('invalid_request', 'malformed URL')
          : err.code === 'FST_ERR_MAX_PARAM_LENGTH'
            ? apiError('invalid_request', `a path parameter is longer than ${maxParamLength} characters`)
            : toApiError(err);
      return sendApiError(request, reply, error);
    },
  }) as unknown as FastifyInstance;

  app.decorateRequest('served', undefined);
  app.addHook('onRequest', (request, reply, done) => {
    reply.header('x-request-id', request.id);
    logWhenEnded(request, reply);
    done();
  });
  installErrorHandling(app);
  installCompression(app);
  await app.register(cors, { origin: '*', credentials: false, exposedHeaders, maxAge: 600, strictPreflight: false });

  // JSON bodies only, parsed once with the platform parser; other media types are a client error.
  app.removeAllContentTypeParsers();
  // A request that matched no route is answered 404/405 whatever its body, so its body is not judged.
  const unrouted = (request: FastifyRequest) => request.routeOptions.url === undefined;
  app.addContentTypeParser(/^application\/([\w.+-]+\+)?json\s*(;.*)?$/i, { parseAs: 'buffer' }, (request, body: Buffer, done) => {
    if (unrouted(request)) return done(null, undefined);
    const parseLargeJson = options.parseLargeJson;
    if (parseLargeJson && body.length > OFF_THREAD_JSON_BYTES) {
      // The text is decoded again here only for the rare seed that needs its literal (withExactSeed).
      parseLargeJson(body).then(
        (parsed) => done(null, withExactSeed(parsed, (parsed as { seed?: unknown } | null)?.seed === MAX_SEED ? body.toString('utf8') : '')),
        (err: Error) => done(err instanceof SyntaxError ? badJson() : err, undefined),
      );
      return;
    }
    try {
      const text = body.toString('utf8');
      done(null, withExactSeed(JSON.parse(text), text));
    } catch {
      done(badJson(), undefined);
    }
  });
  app.addContentTypeParser('*', (request, payload, done) => {
    if (!unrouted(request)) return done(notJson(), undefined);
    payload.resume();
    payload.once('end', () => done(null, undefined));
    payload.once('error', () => done(null, undefined));
  });

  app.setValidatorCompiler(compileRouteSchema);
  app.setSerializerCompiler(serializeAsJson);
  // The document generator records routes as they are added, so it comes first.
  await registerOpenApi(app);
  healthRoute(app, options.health);
  await options.routes?.(app);
  return app;
}
