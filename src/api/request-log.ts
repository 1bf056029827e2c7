/**
 * One log line per request, written when it ends: when its response has gone out whole, or when the
 * connection closed before that (status 499, nginx's "client closed request"). So a stream's line
 * carries its whole duration and its tokens, and a client that left mid-way shows. Metadata only
 * (the contract's key prefix, user e-mail, IP, endpoint, model, token counts, status, latency):
 * never a body, a prompt, a completion or a key.
 */
import type { FastifyReply, FastifyRequest } from 'fastify';

/** nginx's convention for a request whose client closed the connection before the response was complete. */
export const clientClosedRequest = 499;

export interface ServedTokens {
  prompt_tokens: number;
  /** Null when it cannot be known (a non-streaming body that broke off). */
  completion_tokens: number | null;
}

/** What a route that serves a model adds to its requests' log lines. */
export interface ServedFacts {
  /** The registry's short model id (never the client's string). */
  model: string;
  /** Read when the request ends, so a stream reports what it relayed up to then. */
  tokens(): ServedTokens | null;
}

declare module 'fastify' {
  interface FastifyRequest {
    /** Set by routes that serve a model: the model and tokens for the request's log line. */
    served?: ServedFacts;
  }
}

/** `X-Svc-Workload` is telemetry only: recorded when it is one of the known values, otherwise ignored. */
function workloadOf(request: FastifyRequest): 'interactive' | 'batch' | undefined {
  const value = request.headers['x-svc-workload'];
  return value === 'interactive' || value === 'batch' ? value : undefined;
}

const logged = new WeakSet<object>();

/** Writes the request's line when its response closes (idempotent: every path that can answer calls it). */
export function logWhenEnded(request: FastifyRequest, reply: FastifyReply): void {
  if (logged.has(reply.raw)) return;
  logged.add(reply.raw);
  const started = performance.now();
  reply.raw.once('close', () => {
    const tokens = request.served?.tokens() ?? null;
    request.log.info(
      {
        method: request.method,
        route: request.routeOptions.url ?? 'unmatched',
        model: request.served?.model,
        key_prefix: request.keyPrefix,
        // The contract's logged metadata: the key's owner (once a key authenticated the request) and the client's address.
        email: request.apiKey?.email,
        client_ip: request.ip,
        status: reply.raw.writableFinished ? reply.statusCode : clientClosedRequest,
        duration_ms: Math.round((performance.now() - started) * 100) / 100,
        prompt_tokens: tokens?.prompt_tokens,
        completion_tokens: tokens?.completion_tokens,
        workload: workloadOf(request),
      },
      'request',
    );
  });
}
