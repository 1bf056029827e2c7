/**
 * One request to POST /v1/completions as it goes through the route's steps (steps.ts, engine-call.ts,
 * relay.ts, settle.ts): what each step finds out and the next one needs.
 */
import { randomBytes } from 'node:crypto';
import type { FastifyReply, FastifyRequest, onRequestAsyncHookHandler } from 'fastify';
import { ApiError } from '../../errors/index.ts';
import type { EngineClient } from '../../engine-client/index.ts';
import type { CompletionContext, PreparedCompletion } from '../../completion-request/index.ts';
import { refusalOf, type Admission, type MeteredKey, type Metering } from '../../metering/index.ts';
import type { RequestFactsData } from '../../../events/index.ts';
import type { CheckedCapture } from '../capture-relay.ts';
import type { EngineContextLengths } from '../engine-context.ts';
import type { RelayedUsage } from '../usage-relay.ts';
import type { WriteOrder } from '../write-order.ts';
import type { BackendCall } from '../../backends/index.ts';
import type { ColdBoots, ColdBootWait } from '../cold-boot.ts';

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

/** What every request of the route shares. */
export interface CompletionRoute {
  options: CompletionRouteOptions;
  /** Which goes first, the reservation's append or the early engine call's write (write-order.ts). */
  writeOrder: WriteOrder;
  /** Engine-reported context lengths, for a default max_tokens on a model of unknown context (engine-context.ts). */
  contextLengths: EngineContextLengths;
}

/** The abort reason of the request window's deadline (the controller's only other abort is the client leaving). */
export const deadlineReason = Symbol('deadline');

export class CompletionCall {
  readonly started = performance.now();
  readonly key: RequestKey | null;
  /**
   * Holds are keyed by request id: one the client chose (X-Request-Id) gets a suffix of ours, so two
   * requests sent with the same id can never share a hold.
   */
  readonly meterRequestId: string;
  /** Aborted when the client leaves (watched from the cold-boot step on) or the request window closes. */
  readonly controller = new AbortController();
  /** The validated request, ready for the engine (preflight). */
  prepared!: PreparedCompletion;
  /** What is sent to the engine: `prepared`, its max_tokens lowered to what the durable reservation covers. */
  completion!: PreparedCompletion;
  requestFacts!: RequestFactsData;
  backendCall: BackendCall | null = null;
  /** Holds the model's engine up until the response closes; waits out a cold boot before the engine call. */
  coldBoot: ColdBootWait | null = null;
  /** The reservation; null when metering is off, or once it turned out never made (nothing to settle). */
  admission: Admission | null = null;
  gpuStarted = 0;
  /** The gateway's own time before the engine call that answered (a cold boot's wait excluded), when that call was sent, and when its headers came. */
  readonly engineCall = { gatewayMs: 0, postedAt: 0, answeredAt: 0 };
  /** A capture's body checked as the early engine call answers, while the reservation becomes durable. */
  earlyCapture: { relayed: RelayedUsage; checked: Promise<CheckedCapture | null> } | null = null;
  /** What the relay saw so far, for the request's log line (request-log.ts). */
  relayed: RelayedUsage | null = null;

  constructor(
    readonly request: FastifyRequest,
    readonly reply: FastifyReply,
    readonly route: CompletionRoute,
  ) {
    this.key = route.options.metering?.keyOf(request) ?? null;
    this.meterRequestId = request.headers['x-request-id'] === request.id ? `${request.id}.${randomBytes(6).toString('hex')}` : request.id;
  }

  get options(): CompletionRouteOptions {
    return this.route.options;
  }

  /** The engine's identifying headers (X-Svc-Upstream-*), on answers and errors alike. */
  upstreamHeaders(): Record<string, string> {
    return this.options.engines.upstreamHeaders(this.prepared.model.id);
  }

  facts(model: string | null, user: string | null): RequestFactsData {
    return {
      request_id: this.meterRequestId,
      key_prefix: this.key?.prefix ?? '',
      email: this.key?.email ?? '',
      client_ip: this.request.ip ?? null,
      endpoint: '/v1/completions',
      model,
      user,
      workload: workloadOf(this.request),
    };
  }

  /** Every request refused after authentication is recorded (metadata only), then answered: returns the error to throw. */
  refused(error: unknown, model: string | null, user: string | null, inputTokens: number): unknown {
    const metering = this.options.metering;
    if (this.key && metering && error instanceof ApiError) {
      metering.meter.recordRejection(this.key.keyId, this.facts(model, user), error.code, error.status, inputTokens, performance.now() - this.started, refusalOf(error));
    }
    return error;
  }

  /** A refusal once the request is prepared: recorded with its model, user and prompt tokens. */
  refusedPrepared(error: unknown): unknown {
    return this.refused(error, this.prepared.model.id, this.prepared.user, this.prepared.promptTokens);
  }

  /** The client went away (the controller's only other abort is the request window's deadline). */
  clientLeft(): boolean {
    return this.controller.signal.aborted && this.controller.signal.reason !== deadlineReason;
  }
}

function workloadOf(request: FastifyRequest): 'interactive' | 'batch' | null {
  const value = request.headers['x-svc-workload'];
  return value === 'interactive' || value === 'batch' ? value : null;
}
