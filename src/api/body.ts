// Request bodies: the size limit and the two errors a body itself can earn, stated once for the
// content-type parser, fastify's body reader and the error handler.
import { apiError, type ApiError } from '../errors/index.ts';

/** The contract's request body limit (8 MB). */
export const maxBodyBytes = 8 * 1024 * 1024;

/** The 413 for a body over `limit` bytes (the route's own limit: 8 MB for completions, the harvest cap for a harvest). */
export const bodyTooLarge = (limit: number = maxBodyBytes): ApiError => apiError('request_too_large', `request body exceeds the ${formatBytes(limit)} limit`);

function formatBytes(bytes: number): string {
  const mb = bytes / (1024 * 1024);
  return Number.isInteger(mb) ? `${mb} MB` : `${bytes}-byte`;
}

export const badJson = (): ApiError => apiError('bad_json', 'request body is not valid JSON');

export const notJson = (): ApiError => apiError('invalid_request', 'Content-Type must be application/json');
