import { randomBytes } from 'node:crypto';
import type { FastifyInstance, FastifyReply, FastifyRequest, FastifySchemaCompiler, onRequestAsyncHookHandler } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type, type TSchema } from 'typebox';
import { apiError, ApiError } from '../errors/index.ts';
import { WriteOrder } from './write-order.ts';
import type { EngineClient, EngineResponse } from '../engine-client/index.ts';
import type { CompletionContext, PreparedCompletion } from '../completion-request/index.ts';
import { CompletionRequest, completionRequestError, lowerMaxTokens, prepareValidCompletionAsync } from '../completion-request/index.ts';
import { refusalOf, type Admission, type MeteredKey, type Metering, type Reservation, type Voiding } from '../metering/index.ts';
import type { RequestFactsData } from '../../events/index.ts';
import { billingBasis } from '../../deciders/billing.ts';
import { apiKeySecurity, compileRouteSchema, errorResponses, okResponse } from './route-schema.ts';
import { checkCapture, type CheckedCapture } from './capture-relay.ts';
import { EngineContextLengths } from './engine-context.ts';
import { bodyWithByteOffsets, needsByteOffsets, rewriteEngineStream } from './stream-rewrite.ts';
import { acceptsGzip, feed, gzipStream, sendUncompressed } from './compression.ts';
import { SseUsageRelay, UsageTail, usageFrom, type RelayedUsage } from './usage-relay.ts';
import type { ServedTokens } from './request-log.ts';
import type { BackendCall } from '../backends/index.ts';
import { ColdBootWait, type ColdBoots } from './cold-boot.ts';

export interface CompletionRouteOptions {
  context: CompletionContext;
  engines: EngineClient;
  /** Non-streaming request window (the contract's 14 minutes). */
  requestWindowMs: number;
  /** Called when a backend served a completion (for health and /metrics), with the time the gateway added to it so far. */
  onServed?: (modelId: string, addedMs: number) => void;
  /** The API-key hook (src/api/auth.ts): sets request.keyPrefix and request.apiKey, or answers 401. */
  authenticate: onRequestAsyncHookHandler;
  /** Budgets and limits per key; absent only when metering is switched off (SVC_METERING=off). */
  metering?: { meter: Metering; keyOf(request: FastifyRequest): RequestKey | null };
  /** Each backend's circuit breaker (src/backends): asked before anything is held, told how the engine call went. */
  backends?: { admit(modelId: string): BackendCall | Promise<BackendCall> };
  /** Each model's platform: a request to a cold model waits out its boot inside itself (cold-boot.ts). */
  coldBoots?: ColdBoots;
}

/** The authenticated key of a request, as metering needs it. */
export interface RequestKey {
  keyId: string;
  prefix: string;
  email: string;
  /** The key's status and budgets now (read again at the reservation re-check). */
  current(): Promise<MeteredKey>;
}

/** Bodies up to this size are gathered before sending rather than piped. */
const smallBodyBytes = 256 * 1024;
const deadlineReason = Symbol('deadline');

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

function workloadOf(request: FastifyRequest): 'interactive' | 'batch' | null {
  const value = request.headers['x-svc-workload'];
  return value === 'interactive' || value === 'batch' ? value : null;
}

export function completionRoutes(app: FastifyInstance, options: CompletionRouteOptions): void {
  const { engines, context, requestWindowMs, metering } = options;
  const writeOrder = new WriteOrder();
  const contextLengths = new EngineContextLengths(engines, (id) => options.coldBoots?.platformOf(id)?.ensureRunning()?.ready ?? null);

  // attachValidation: a body the schema refuses is still recorded as a refused request, then answered.
  const route = { schema: completionSchema, validatorCompiler: validateCompletion, onRequest: options.authenticate, attachValidation: true };
  app.withTypeProvider<TypeBoxTypeProvider>().post('/v1/completions', route, async (request, reply) => {
    const started = performance.now();
    const key = metering?.keyOf(request) ?? null;
    // Holds are keyed by request id: one the client chose (X-Request-Id) gets a suffix of ours, so two
    // requests sent with the same id can never share a hold.
    const meterRequestId = request.headers['x-request-id'] === request.id ? `${request.id}.${randomBytes(6).toString('hex')}` : request.id;
    const facts = (model: string | null, user: string | null): RequestFactsData => ({
      request_id: meterRequestId,
      key_prefix: key?.prefix ?? '',
      email: key?.email ?? '',
      client_ip: request.ip ?? null,
      endpoint: '/v1/completions',
      model,
      user,
      workload: workloadOf(request),
    });
    // Every request refused after authentication is recorded (metadata only), then answered.
    const refused = (error: unknown, model: string | null, user: string | null, inputTokens: number): unknown => {
      if (key && metering && error instanceof ApiError) {
        metering.meter.recordRejection(key.keyId, facts(model, user), error.code, error.status, inputTokens, performance.now() - started, refusalOf(error));
      }
      return error;
    };

    let prepared: PreparedCompletion;
    try {
      if (request.validationError) throw request.validationError;
      // Long prompts are tokenized off the event loop; a default max_tokens on a model of unknown context is sized
      // to what its engine reports (engine-context.ts).
      prepared = await contextLengths.fit(await prepareValidCompletionAsync(request.body, context));
    } catch (error) {
      const body = request.body as { model?: unknown; user?: unknown } | null;
      throw refused(error, typeof body?.model === 'string' ? body.model : null, typeof body?.user === 'string' ? body.user : null, 0);
    }
    const model = prepared.model;
    const requestFacts = facts(model.id, prepared.user);
    // The request's log line (request-log.ts) names the model and, read when it ends, the tokens relayed so far.
    let relayed: RelayedUsage | null = null;
    request.served = { model: model.id, tokens: () => tokensSeen(relayed, prepared) };
    // The backend's circuit breaker, before anything is held: an open one refuses at once (503 circuit_open, recorded as rejected).
    let backendCall: BackendCall | null = null;
    if (options.backends) {
      try {
        const admitted = options.backends.admit(model.id);
        backendCall = admitted instanceof Promise ? await admitted : admitted;
      } catch (error) {
        throw refused(error, model.id, prepared.user, prepared.promptTokens);
      }
    }
    // Holds the model's engine up until the response closes; waits out a cold boot before the engine call.
    const coldBoot = ColdBootWait.begin(options.coldBoots, model.id, reply, prepared.stream, engines.upstreamHeaders(model.id));

    const controller = new AbortController();
    /** The client went away (the route's only other abort is the request window's deadline). */
    const clientLeft = () => controller.signal.aborted && controller.signal.reason !== deadlineReason;
    // A client that goes away cancels the upstream request (and leaves the key's queue).
    reply.raw.once('close', () => {
      if (!reply.raw.writableFinished) controller.abort();
    });
    // A cold model's boot, up to its acknowledgement and the grace, before anything is held: one that
    // stalls or fails by then is refused (recorded as rejected), with no reservation made or left.
    const booting = coldBoot?.beforeAdmission(controller.signal);
    if (booting) {
      try {
        await booting;
      } catch (error) {
        if (controller.signal.aborted) return reply; // the client left; nothing was held
        backendCall?.failed(error);
        throw refused(error, model.id, prepared.user, prepared.promptTokens);
      }
    }

    // Admission: the worst case is reserved in memory (limits and budgets decided at once, queueing if
    // the key's slots are taken); the route waits for it to be durable before calling the engine.
    let admission: Admission | null = null;
    if (key && metering) {
      const caps = model.capabilities;
      try {
        admission = await metering.meter.admit({
          key: key.current,
          keyId: key.keyId,
          facts: requestFacts,
          inputTokens: prepared.promptTokens,
          maxTokens: prepared.maxTokens,
          maxTokensRequested: prepared.maxTokensSource === 'client' ? prepared.maxTokensRequested : null,
          choices: prepared.promptCount * prepared.n,
          limits: { maxActive: caps.max_inflight_per_key, maxQueued: caps.max_queued_per_key, perMinute: caps.rate_limit_per_minute },
          signal: controller.signal,
        });
      } catch (error) {
        if (controller.signal.aborted) return reply; // left the queue: nothing to answer
        throw refused(error, model.id, prepared.user, prepared.promptTokens);
      }
    }
    const atLimit = (reservation: Reservation) => lowerMaxTokens(prepared, reservation.maxTokens);
    const gpuStarted = performance.now();
    // The gateway's own time before the engine call that answered (a cold boot's wait excluded), when that call was sent, and when its headers came.
    const engineCall = { gatewayMs: 0, postedAt: 0, answeredAt: 0 };
    /** `posted`: called once the engine call is on its way (its write queued), before it is answered. */
    const dispatch = async (completion: PreparedCompletion, signal: AbortSignal, posted?: () => void): Promise<EngineResponse> => {
      let deadline: NodeJS.Timeout | null = null;
      try {
        const entered = performance.now();
        // A cold boot is bounded by its own safety deadline (a boot that never finishes is platform_cold_boot,
        // no fault of the engine's); the request window times the generation, from the engine call on.
        await coldBoot?.waitOut(signal, admission?.durable ?? Promise.resolve(), completion.maxTokensClamped);
        if (!completion.stream) deadline = setTimeout(() => controller.abort(deadlineReason), requestWindowMs);
        const call = engines.post(model.id, '/v1/completions', JSON.stringify(completion.engineBody), signal);
        const postedAt = performance.now();
        posted?.();
        const response = await call;
        if (!signal.aborted) {
          engineCall.gatewayMs = entered - started;
          engineCall.postedAt = postedAt;
          engineCall.answeredAt = performance.now();
        }
        return response;
      } catch (err) {
        if (controller.signal.reason === deadlineReason) {
          throw apiError('upstream_deadline', `generation did not finish within the ${Math.round(requestWindowMs / 1000)} s request window and was cancelled`, {
            headers: engines.upstreamHeaders(model.id),
          });
        }
        throw err;
      } finally {
        if (deadline) clearTimeout(deadline);
      }
    };
    /**
     * The engine call made before the reservation is durable, on a signal of its own: the client's
     * leaving (or the deadline) cancels it, and so does the reservation's voiding, which also drops a
     * response that came meanwhile.
     */
    const startEarly = (completion: PreparedCompletion, voiding: Voiding): Promise<EngineResponse> => {
      const call = new AbortController();
      if (controller.signal.aborted) call.abort(controller.signal.reason);
      else controller.signal.addEventListener('abort', () => call.abort(controller.signal.reason), { once: true });
      voiding.onVoided(() => call.abort());
      // Its reservation's append goes out alongside the engine call's write, the longer wait first (WriteOrder).
      const response = dispatch(completion, call.signal, () => metering?.meter.sendDecisions(writeOrder.appendFirst(model.id)));
      response.then(
        (r) =>
          voiding.onVoided(() => {
            r.body.destroy();
            r.release();
          }),
        () => {}, // awaited, and its error thrown, only if not voided
      );
      return response;
    };
    const settle = (usage: RelayedUsage | null, status: number, completion: PreparedCompletion) => {
      if (!admission || !metering) return;
      const billed = billingBasis(usage, completion, { seconds: (performance.now() - gpuStarted) / 1000, costPerSecond: model.cost_per_second });
      void metering.meter.settle(admission, requestFacts, {
        inputTokens: billed.inputTokens,
        outputTokens: billed.outputTokens,
        status,
        latencyMs: performance.now() - started,
        gpuSeconds: billed.gpuSeconds,
        costMicros: billed.costMicros,
        pricePerGpuSecondMicros: billed.pricePerGpuSecondMicros,
        basis: billed.basis,
        disconnected: billed.disconnected,
        generatedOutputTokens: billed.generatedOutputTokens,
        relayedOutputTokens: billed.relayedOutputTokens,
      });
    };

    let completion = prepared;
    let upstream: EngineResponse;
    let earlyCapture: { relayed: RelayedUsage; checked: Promise<CheckedCapture | null> } | null = null;
    try {
      if (admission) {
        // A reservation in this process's slot lease starts the engine now, its append alongside (no
        // other process can take that slot meanwhile). Any other waits until the reservation is durable:
        // decided in memory, it can still be refused on fresh state (another process took the key's last
        // slot or budget first), and an engine call made on it would count against the key's 16 at the
        // engine. Either way no byte reaches the client before the reservation is durable.
        const early = admission.startNow ? startEarly(atLimit(admission), admission.voiding) : null;
        // A capture's body is read and checked as it arrives, while the reservation becomes durable too
        // (only sending it waits for that): held back, the engine's socket would stall meanwhile.
        if (early && prepared.capture) {
          const relayedEarly: RelayedUsage = cutShort();
          const checked = early.then((r) => checkCapture(r, prepared.captureLayerCount, engines.upstreamHeaders(model.id), controller.signal, relayedEarly));
          checked.catch(() => {}); // awaited, and its error thrown, only if the early call is the one answered
          earlyCapture = { relayed: relayedEarly, checked };
        }
        let stored: Reservation;
        let durableAt = 0;
        try {
          stored = await admission.durable;
          durableAt = performance.now();
        } catch (error) {
          admission = null; // nothing was reserved: nothing to settle
          throw refused(error, model.id, prepared.user, prepared.promptTokens);
        }
        completion = atLimit(stored);
        // Voided: decided again otherwise (fewer tokens now fit, say); the early call was cancelled. Its
        // replacement holds the same slot, so it starts once the cancelled call has ended on this side
        // (its connection closed), not beside it: the key's running requests at the engine stay in bound.
        if (early && !admission.voiding.voided) {
          upstream = await early;
          writeOrder.observe(model.id, engineCall.answeredAt - engineCall.postedAt, durableAt - engineCall.postedAt);
        } else {
          earlyCapture = null;
          if (early) await early.then((r) => r.body.destroyed || new Promise((closed) => r.body.once('close', closed)), () => {});
          upstream = await dispatch(completion, controller.signal);
        }
      } else {
        upstream = await dispatch(completion, controller.signal);
      }
    } catch (err) {
      // A client that left while the model booted used nothing: the engine was never called.
      settle(controller.signal.aborted && !coldBoot?.leftDuringBoot ? cutShort() : null, err instanceof ApiError ? err.status : 500, completion);
      if (clientLeft()) return reply; // the client left: nothing to answer, and no fault of the backend's
      backendCall?.failed(err);
      if (coldBoot?.committed) return coldBoot.fail(err); // 200 went out with the keepalives: the error goes in the body
      throw err;
    }
    upstream.body.once('close', upstream.release);
    backendCall?.succeeded();
    options.onServed?.(model.id, engineCall.gatewayMs + performance.now() - engineCall.answeredAt);

    reply.headers(engines.upstreamHeaders(model.id));
    if (completion.maxTokensClamped) reply.header('x-svc-max-tokens-clamped', completion.maxTokensClamped);

    if (completion.stream) {
      // SSE frames are relayed whole as they arrive and never compressed, so no frame is held back.
      reply.header('content-type', 'text/event-stream; charset=utf-8').header('cache-control', 'no-cache').header('x-accel-buffering', 'no');
      // text_offset in bytes and prompt_logprobs: 0 delivered, as the contract says (stream-rewrite.ts).
      const contractual = rewriteEngineStream(upstream, completion, { engines, modelId: model.id, requestId: request.id, upstreamHeaders: engines.upstreamHeaders(model.id), signal: controller.signal });
      const relay = relayEvents(contractual, request.id, engines.upstreamHeaders(model.id), completion.clientWantsUsage);
      relayed = relay.result;
      relay.once('close', () => settle(relay.result, 200, completion));
      // Written by the relay itself, not piped by reply.send: its write callbacks say which frames the
      // client's socket took (relayedFrames), which a pipe's writes do not report.
      reply.hijack();
      if (!coldBoot?.handOver()) reply.raw.writeHead(reply.statusCode, reply.getHeaders() as Record<string, string | number>);
      relay.writeTo(reply.raw);
      return reply;
    }

    reply.header('content-type', 'application/json');
    const length = Number(upstream.headers['content-length'] ?? NaN);
    if ((length <= smallBodyBytes || needsByteOffsets(completion, length)) && !completion.capture) {
      // A small body is gathered and written in one go: cheaper than a pipe for the common case. One
      // with logprobs is gathered whatever its size: its text_offset is made byte offsets (stream-rewrite.ts).
      let whole: ArrayBuffer;
      try {
        whole = await upstream.body.arrayBuffer();
      } catch {
        // The client left (the engine call was cancelled) or the engine's connection broke: settled as cut short.
        settle(cutShort(), 502, completion);
        if (clientLeft()) return reply;
        const broke = apiError('upstream_unreachable', 'the model server connection broke while sending the completion', { headers: engines.upstreamHeaders(model.id) });
        // After a cold boot's commit the 200 went out with the keepalives: the error goes in the body, and they stop.
        if (coldBoot?.committed) return coldBoot.fail(broke);
        throw broke;
      }
      const body = bodyWithByteOffsets(Buffer.from(whole), completion);
      relayed = { usage: usageFrom(body.subarray(Math.max(0, body.length - 4096))), contentFrames: 0, relayedFrames: 0, completed: true };
      settle(relayed, 200, completion);
      if (coldBoot?.committed) return coldBoot.end(body);
      return reply.send(body); // gzipped on its way out when the client accepts it (compression.ts)
    }
    if (completion.capture) {
      const captured: RelayedUsage = earlyCapture?.relayed ?? cutShort();
      relayed = captured;
      // Settled once the response is over: sent whole, refused (502), or left by the client (maybe
      // already, while the engine answered: then its 'close' has been and gone).
      const over = () => {
        upstream.body.destroy();
        settle(captured, reply.statusCode, completion);
      };
      if (clientLeft()) {
        over();
        return reply;
      }
      reply.raw.once('close', over);
      if (coldBoot?.committed) return coldBoot.sendCapture(upstream, completion.captureLayerCount, controller.signal, captured, earlyCapture?.checked ?? null);
      return sendCapture(reply, completion, upstream, engines.upstreamHeaders(model.id), controller.signal, captured, earlyCapture?.checked ?? null);
    }
    // Larger bodies flow through a tap that keeps their first and last bytes, where `usage` is.
    const tail = new UsageTail();
    relayed = tail.result;
    upstream.body.once('error', (err) => tail.destroy(err));
    upstream.body.pipe(tail);
    tail.once('close', () => {
      upstream.body.destroy();
      settle(tail.result, reply.statusCode, completion);
    });
    reply.raw.once('close', () => tail.destroy());
    if (coldBoot?.committed) return coldBoot.pipe(tail);

    if (acceptsGzip(request)) {
      // Fed with backpressure from the tap (a full-vocabulary body can be a gigabyte).
      const gzip = gzipStream(reply);
      void feed(tail, gzip);
      return reply.send(gzip);
    }
    if (Number.isFinite(length)) reply.header('content-length', length);
    return reply.send(tail);
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

/** What the relay saw of a body that did not come through whole (nothing yet, or cut short). */
const cutShort = (): RelayedUsage => ({ usage: null, contentFrames: 0, relayedFrames: 0, completed: false });

/** A request's tokens for its log line: the engine's usage when it came through, else what the relay saw. */
function tokensSeen(relayed: RelayedUsage | null, request: PreparedCompletion): ServedTokens {
  if (relayed?.usage) return { prompt_tokens: relayed.usage.prompt_tokens, completion_tokens: relayed.usage.completion_tokens };
  if (relayed === null) return { prompt_tokens: request.promptTokens, completion_tokens: 0 };
  // A stream relays one content frame per token per choice; a body that broke off cannot say.
  return { prompt_tokens: request.promptTokens, completion_tokens: request.stream ? relayed.contentFrames : null };
}

/**
 * Relays SSE frames whole. The engine is always asked for usage (streams are always billed); its usage
 * frame is dropped unless the client asked for it. If the engine's connection breaks mid-stream, the
 * client gets the contract's mid-stream error (`data: {"error": ...}`) and `data: [DONE]` after the last
 * whole frame, never torn bytes.
 */
function relayEvents(upstream: EngineResponse, requestId: string, headers: Record<string, string>, forwardUsage: boolean): SseUsageRelay {
  const relay = new SseUsageRelay(forwardUsage);
  upstream.body.once('error', () => {
    const error = apiError('upstream_unreachable', 'the model server connection broke during the stream', { headers });
    relay.fail(`data: ${JSON.stringify(error.body(requestId))}\n\ndata: [DONE]\n\n`);
  });
  relay.once('close', () => upstream.body.destroy());
  upstream.body.pipe(relay);
  return relay;
}

/** A capture is relayed unchanged once its envelope holds every requested layer (see capture-relay.ts). */
async function sendCapture(reply: FastifyReply, prepared: PreparedCompletion, upstream: EngineResponse, headers: Record<string, string>, signal: AbortSignal, relayed: RelayedUsage, started: Promise<CheckedCapture | null> | null): Promise<FastifyReply> {
  const checked = await (started ?? checkCapture(upstream, prepared.captureLayerCount, headers, signal, relayed));
  if (checked === null) return reply; // the client left; nothing to answer
  sendUncompressed(reply);
  if (checked.length !== null) reply.header('content-length', checked.length);
  if (!Array.isArray(checked.body)) return reply.send(checked.body);
  // The whole body is held: it leaves in one corked write, a writev of all its chunks, where a pipe
  // would write and wait for the socket to drain chunk by chunk (the capture bench: 11 MB in 64 KB
  // chunks). Each chunk is let go once the socket has sent it; a client that leaves closes the
  // response, which ends the engine's body and settles the request (the route's close listener).
  reply.hijack();
  const res = reply.raw;
  res.writeHead(reply.statusCode, reply.getHeaders() as Record<string, string | number>);
  res.cork();
  for (const chunk of checked.body) res.write(chunk);
  checked.body.length = 0;
  res.uncork();
  res.end();
  return reply;
}
