/**
 * Authentication hooks. One `onRequest` hook for every route that needs an API key (it runs before
 * the body is read, so an unauthenticated caller never costs a parse), one for the admin API.
 */
import type { FastifyInstance, FastifyRequest, onRequestAsyncHookHandler } from 'fastify';
import { apiError } from '../errors/index.ts';
import { bearerToken, tokensMatch, type KeyService, type KeyView } from '../keys/index.ts';
import type { AuthFailureLimiter } from './auth-failures.ts';

declare module 'fastify' {
  interface FastifyRequest {
    /** The API key's public prefix, once the Authorization header named an existing key (logged as key_prefix). */
    keyPrefix?: string;
    /** The authenticated key's state (status, budgets, owner) at authentication time. */
    apiKey?: KeyView | null;
  }
}

/** Declares the request fields the hooks set (a stable object shape for every request). */
export function decorateAuthenticatedRequest(app: FastifyInstance): void {
  if (!app.hasRequestDecorator('keyPrefix')) app.decorateRequest('keyPrefix', undefined);
  if (!app.hasRequestDecorator('apiKey')) app.decorateRequest('apiKey', null);
}

/**
 * The hook for routes that need a key: sets `request.keyPrefix` and `request.apiKey`, or answers 401
 * `invalid_api_key` for a missing, malformed, unknown, wrong, paused or revoked key.
 */
export function requireApiKey(keys: KeyService, failures?: AuthFailureLimiter): onRequestAsyncHookHandler {
  return async function authenticate(request: FastifyRequest) {
    const refused = failures?.refusal(request.ip);
    if (refused) throw refused;
    const result = await keys.authenticate(request.headers.authorization);
    if (result.prefix) request.keyPrefix = result.prefix;
    if (!result.ok) {
      failures?.failed(request.ip);
      throw result.error;
    }
    request.apiKey = result.key;
  };
}

/** The hook for the admin API: `Authorization: Bearer <SVC_ADMIN_TOKEN>`, compared in constant time. */
export function requireAdminToken(adminToken: string, failures?: AuthFailureLimiter): onRequestAsyncHookHandler {
  if (adminToken === '') throw new Error('the admin token must not be empty');
  return async function authenticateAdmin(request: FastifyRequest) {
    const refused = failures?.refusal(request.ip);
    if (refused) throw refused;
    const token = bearerToken(request.headers.authorization);
    const error =
      token === null
        ? apiError('invalid_api_key', 'missing admin token: send Authorization: Bearer <SVC_ADMIN_TOKEN>')
        : !tokensMatch(token, adminToken)
          ? apiError('invalid_api_key', 'invalid admin token')
          : null;
    if (error) {
      failures?.failed(request.ip);
      throw error;
    }
  };
}
