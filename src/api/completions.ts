import { PassThrough, type Readable, type Writable } from 'node:stream';
import { once } from 'node:events';
import { createGzip, constants as zlibConstants } from 'node:zlib';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { apiError, ApiError } from '../errors/index.ts';
import type { EngineClient, EngineResponse } from '../engine-client/index.ts';
import type { CompletionContext, PreparedCompletion } from '../completion-request/index.ts';
import { prepareCompletion } from '../completion-request/index.ts';

export interface CompletionRouteOptions {
  context: CompletionContext;
  engines: EngineClient;
  /** Non-streaming request window (the contract's 14 minutes). */
  requestWindowMs: number;
  /** Called when a backend served a completion, for health's last_completion_at. */
  onServed?: (modelId: string) => void;
}

/** Smallest non-streaming body worth compressing when the client accepts gzip. */
const gzipMinBytes = 1024;
/** Bodies up to this size are gathered before sending rather than piped. */
const smallBodyBytes = 256 * 1024;
const deadlineReason = Symbol('deadline');

function acceptsGzip(request: FastifyRequest): boolean {
  const header = request.headers['accept-encoding'];
  return typeof header === 'string' && /\bgzip\b/.test(header);
}

export function completionRoutes(app: FastifyInstance, options: CompletionRouteOptions): void {
  const { engines, context, requestWindowMs } = options;

  app.post('/v1/completions', async (request, reply) => {
    const prepared = prepareCompletion(request.body, context);
    const model = prepared.model;
    // Admission (authentication, limits, budget reservation) slots in here, between validation and dispatch.

    const controller = new AbortController();
    // A client that goes away cancels the upstream request.
    reply.raw.once('close', () => {
      if (!reply.raw.writableFinished) controller.abort();
    });
    const deadline = prepared.stream ? null : setTimeout(() => controller.abort(deadlineReason), requestWindowMs);

    let upstream: EngineResponse;
    try {
      upstream = await engines.post(model.id, '/v1/completions', JSON.stringify(prepared.engineBody), controller.signal);
    } catch (err) {
      if (controller.signal.reason === deadlineReason) {
        throw apiError('upstream_deadline', `generation did not finish within the ${Math.round(requestWindowMs / 1000)} s request window and was cancelled`, {
          headers: engines.upstreamHeaders(model.id),
        });
      }
      if (controller.signal.aborted) return reply; // the client left; nothing to answer
      throw err;
    } finally {
      if (deadline) clearTimeout(deadline);
    }
    upstream.body.once('close', upstream.release);
    options.onServed?.(model.id);

    reply.headers(engines.upstreamHeaders(model.id));
    if (prepared.maxTokensClamped) reply.header('x-svc-max-tokens-clamped', prepared.maxTokensClamped);

    if (prepared.stream) {
      // SSE frames are piped as they arrive and never compressed, so no frame is held back.
      reply.header('content-type', 'text/event-stream; charset=utf-8').header('cache-control', 'no-cache').header('x-accel-buffering', 'no');
      return reply.send(relayEvents(upstream, request.id, engines.upstreamHeaders(model.id)));
    }

    reply.header('content-type', 'application/json').header('vary', 'Accept-Encoding');
    if (prepared.capture) return sendCapture(reply, prepared, upstream, engines.upstreamHeaders(model.id));

    const length = Number(upstream.headers['content-length'] ?? NaN);
    if (acceptsGzip(request) && !(length < gzipMinBytes)) {
      // Level 1: the large bodies here (full-vocabulary logprobs) are highly redundant JSON, so speed wins.
      reply.header('content-encoding', 'gzip');
      const gzip = createGzip({ level: 1, chunkSize: 128 * 1024, flush: zlibConstants.Z_NO_FLUSH });
      void feed(upstream.body, gzip);
      return reply.send(gzip);
    }
    if (length <= smallBodyBytes) {
      // A small body is gathered and written in one go: cheaper than a pipe for the common case.
      return reply.send(Buffer.from(await upstream.body.arrayBuffer()));
    }
    if (Number.isFinite(length)) reply.header('content-length', length);
    return reply.send(upstream.body);
  });

  // Always refused, whatever the body: parse nothing, point callers to /v1/completions.
  app.register(async (scope) => {
    scope.removeAllContentTypeParsers();
    scope.addContentTypeParser('*', (_request, payload, done) => {
      payload.resume();
      payload.once('end', () => done(null, undefined));
      payload.once('error', () => done(null, undefined));
    });
    scope.post('/v1/chat/completions', { bodyLimit: Number.MAX_SAFE_INTEGER }, async () => {
      throw apiError('chat_completions_unsupported', 'chat completions are not supported: these are base models and prompts are never templated; send raw text to POST /v1/completions');
    });
  });
}

/**
 * Writes a body into a compressor with backpressure. An explicit loop rather than `pipe`: piping
 * undici's body into zlib ran five times slower here (the parser paused and resumed on every chunk).
 * A body that breaks half-way destroys the compressor, so the client's response ends too.
 */
async function feed(source: Readable, sink: Writable): Promise<void> {
  try {
    for await (const chunk of source) {
      if (sink.write(chunk)) continue;
      await Promise.race([once(sink, 'drain'), once(sink, 'close')]);
      if (sink.destroyed) {
        source.destroy(); // the client left
        return;
      }
    }
    sink.end();
  } catch (err) {
    sink.destroy(err as Error);
  }
}

/**
 * Pipes SSE frames through unchanged. If the engine's connection breaks mid-stream, the client gets the
 * contract's mid-stream error (`data: {"error": ...}`) and `data: [DONE]` instead of a torn stream.
 */
function relayEvents(upstream: EngineResponse, requestId: string, headers: Record<string, string>): PassThrough {
  const out = new PassThrough();
  upstream.body.once('error', () => {
    if (out.destroyed) return; // the client left first; nothing to tell
    const error = apiError('upstream_unreachable', 'the model server connection broke during the stream', { headers });
    out.end(`data: ${JSON.stringify(error.body(requestId))}\n\ndata: [DONE]\n\n`);
  });
  out.once('close', () => upstream.body.destroy());
  upstream.body.pipe(out);
  return out;
}

async function sendCapture(reply: FastifyReply, prepared: PreparedCompletion, upstream: EngineResponse, headers: Record<string, string>): Promise<FastifyReply> {
  // A capture body is parsed once to check that every requested layer came back, then sent as received.
  const raw = Buffer.from(await upstream.body.arrayBuffer());
  const expected = prepared.captureLayerCount;
  if (expected !== null) {
    let layers: number | null = null;
    try {
      const parsed = JSON.parse(raw.toString('utf8')) as { activations?: { residual_stream?: { shape?: number[] } } };
      layers = parsed.activations?.residual_stream?.shape?.[0] ?? null;
    } catch {
      layers = null;
    }
    if (layers === null || layers < expected) {
      throw new ApiError('capture_incomplete', `the activation capture returned ${layers ?? 0} of ${expected} requested layers`, { headers });
    }
  }
  return reply.header('content-length', raw.length).send(raw);
}
