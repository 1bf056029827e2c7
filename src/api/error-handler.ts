import { StoreUnavailable } from '../store/index.ts';
import type { FastifyError, FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { ApiError, apiError } from '../errors/index.ts';
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { badJson, bodyTooLarge, notJson } from './body.ts';
import { requestIdFor } from './request-id.ts';

/** Maps anything thrown on the request path to the contract's envelope; internals never leak. */
export function toApiError(err: unknown, bodyLimit?: number): ApiError {
  if (err instanceof ApiError) return err;
  const e = err as FastifyError & { body?: unknown };
  switch (e?.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return bodyTooLarge(bodyLimit);
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
  if (typeof e?.statusCode === 'number' && e.statusCode === 413) return bodyTooLarge(bodyLimit);
  // A plugin's own refusal (the static files of /swagger: 403 for a path outside them, 404): not there.
  if (e?.statusCode === 403 || e?.statusCode === 404) return apiError('not_found', 'no such file');
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
    const error = toApiError(err, request.routeOptions?.bodyLimit);
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

/**
 * Node's HTTP parser refuses some requests before fastify sees them (headers over 16 KB, a malformed
 * request line or header, a request not received in time): answered in the envelope with a request
 * id, as every response is, instead of Node's or fastify's bare text, then the connection is closed.
 */
export function answerClientError(err: NodeJS.ErrnoException, socket: Duplex): void {
  if (err.code === 'ECONNRESET' || socket.destroyed) return;
  const error =
    err.code === 'HPE_HEADER_OVERFLOW'
      ? apiError('invalid_request', 'the request headers are larger than 16 KB', { status: 431 })
      : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
        ? apiError('invalid_request', 'the request was not received in time', { status: 408 })
        : apiError('invalid_request', 'malformed HTTP request');
  const requestId = requestIdFor({ headers: {} } as IncomingMessage);
  const body = JSON.stringify(error.body(requestId));
  const headers = { 'content-type': 'application/json; charset=utf-8', 'content-length': String(Buffer.byteLength(body)), 'x-request-id': requestId, connection: 'close', ...error.headers };
  const head = Object.entries(headers).map(([name, value]) => `${name}: ${value}\r\n`).join('');
  const reason = { 400: 'Bad Request', 408: 'Request Timeout', 431: 'Request Header Fields Too Large' }[error.status as 400 | 408 | 431];
  if (socket.writable) socket.end(`HTTP/1.1 ${error.status} ${reason}\r\n${head}\r\n${body}`);
  else socket.destroy();
}
