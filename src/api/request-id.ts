import { randomBytes } from 'node:crypto';
import type { IncomingMessage } from 'node:http';

const clientIdPattern = /^[A-Za-z0-9_-]{1,64}$/;

// A random per-process prefix plus a counter: unique, cheap on the hot path, and never a client's guess.
const processPrefix = randomBytes(6).toString('hex');
let counter = 0;

/** Accepts the client's `X-Request-Id` when it is well-formed, else mints one. */
export function requestIdFor(req: IncomingMessage): string {
  const given = req.headers['x-request-id'];
  if (typeof given === 'string' && clientIdPattern.test(given)) return given;
  counter = (counter + 1) % Number.MAX_SAFE_INTEGER;
  return `req_${processPrefix}${counter.toString(36).padStart(8, '0')}`;
}
