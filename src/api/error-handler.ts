import { StoreUnavailable } from '../store/index.ts';
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError, apiError } from '../errors/index.ts';
import { badJson, bodyTooLarge, notJson } from './body.ts';

/** Maps anything thrown on the request path to the contract's envelope; internals never leak. */
export function toApiError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  const e = err as FastifyError & { body?: unknown };
  switch (e?.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return bodyTooLarge();
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
      return badJson();
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return notJson();
    case 'FST_ERR_CTP_INVALID_CONTENT_LENGTH':
      return apiError('invalid_request', 'Content-Length does not match the body');
  }
  if (e instanceof StoreUnavailable) return apiError('store_unavailable', 'the event store is unavailable; nothing was done, try again');
  if (e instanceof SyntaxError || e?.name === 'SyntaxError') return badJson();
  if (typeof e?.statusCode === 'number' && e.statusCode === 413) return bodyTooLarge();
  return apiError('internal_error', 'internal error');
}

export function sendApiError(request: FastifyRequest, reply: FastifyReply, error: ApiError): FastifyReply {
  return reply.code(error.status).headers(error.headers).type('application/json; charset=utf-8').send(JSON.stringify(error.body(request.id)));
}

export function installErrorHandling(app: FastifyInstance): void {
  // Route patterns by method, so an unknown method on a known path answers 405 with `Allow`, not 404.
  const routes: { method: string; pattern: RegExp }[] = [];
  app.addHook('onRoute', (route) => {
    const pattern = new RegExp(`^${route.url.replace(/[.*+?^${}()|[\]\\]/g, '\\$&').replace(/:[^/]+/g, '[^/]+')}/?$`);
    for (const method of [route.method].flat()) if (method !== 'HEAD' && method !== 'OPTIONS') routes.push({ method, pattern });
  });

  app.setErrorHandler((err, request, reply) => {
    const error = toApiError(err);
    if (error.code === 'internal_error') request.log.error({ err: { message: (err as Error)?.message, stack: (err as Error)?.stack } }, 'unhandled error');
    return sendApiError(request, reply, error);
  });

  app.setNotFoundHandler((request, reply) => {
    const path = request.url.split('?')[0];
    const allowed = [...new Set(routes.filter((r) => r.pattern.test(path)).map((r) => r.method))];
    if (allowed.length > 0) {
      reply.header('allow', allowed.join(', '));
      return sendApiError(request, reply, apiError('method_not_allowed', `method ${request.method} is not allowed on ${path}; use ${allowed.join(', ')}`));
    }
    return sendApiError(request, reply, apiError('not_found', `no route ${request.method} ${path}`));
  });
}
