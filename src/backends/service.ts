/**
 * The breakers on the request path, over the backend decider's rules (deciders/backend.ts): each
 * backend's state in memory (breaker-states.ts). Asking whether a closed breaker lets a call through
 * is one map lookup and a field read: no I/O, no allocation. Outcomes are recorded as commands only
 * when the decider's rule says they may change something. The timed half-open is a workflow
 * (workflows/breaker-half-open.ts, `timers()`), its command sent here so this process sees it at once.
 */
import { randomUUID } from 'node:crypto';
import { backendDecider, breakerAdmission, failureCounts, successCounts, type BackendCommand, type BackendRejection, type BackendState } from '../../deciders/backend.ts';
import type { BackendEvent, BackendKind, BootStage } from '../../events/backend.ts';
import { breakerHalfOpenWorkflow } from '../../workflows/breaker-half-open.ts';
import type { CommandHandler, Outcome } from '../command-handler/index.ts';
import type { ServiceWorkflows } from '../processors/index.ts';
import { backendOutcomeOf } from '../engine-client/index.ts';
import { apiError, type ApiError } from '../errors/index.ts';
import { BreakerStates, snapshotOf, type Entry } from './breaker-states.ts';
import { defaultBreakerSettings, type BackendCall, type BackendSnapshot, type BreakerSettings } from './types.ts';

export interface BackendServiceOptions {
  handler: CommandHandler;
  settings?: Partial<BreakerSettings>;
  /** The clock (epoch ms) commands are stamped with and cooldowns are measured by. */
  now?: () => number;
  /** Headers naming a model's backend on its errors (the engine client's X-Svc-Upstream-*). */
  upstreamHeaders?: (modelId: string) => Record<string, string>;
  /** Told of a command or a read that failed (nothing on the request path waits for them). */
  onError?: (error: unknown, what: string) => void;
}

/** A backend to track: a model's completion engine, and its activation engine when it has one of its own. */
export interface TrackedModel {
  id: string;
  activation?: boolean;
}

const noBreaker: BackendCall = { succeeded() {}, failed() {} };

export class BackendService {
  readonly #handler: CommandHandler;
  readonly #settings: BreakerSettings;
  readonly #now: () => number;
  readonly #upstreamHeaders: (modelId: string) => Record<string, string>;
  readonly #onError: (error: unknown, what: string) => void;
  readonly #states: BreakerStates;

  constructor(options: BackendServiceOptions) {
    this.#handler = options.handler;
    this.#settings = { ...defaultBreakerSettings, ...options.settings };
    this.#now = options.now ?? Date.now;
    this.#upstreamHeaders = options.upstreamHeaders ?? (() => ({}));
    this.#onError = options.onError ?? (() => {});
    this.#states = new BreakerStates(options.handler, this.#onError, (entry) => this.#closedCall(entry));
  }

  get settings(): Readonly<BreakerSettings> {
    return this.#settings;
  }

  /** Loads every tracked backend's stream and follows the others' writes to them. */
  async start(models: readonly TrackedModel[]): Promise<void> {
    await this.#states.start(models.flatMap((m) => [{ modelId: m.id, backend: 'completion' as const }, ...(m.activation ? [{ modelId: m.id, backend: 'activation' as const }] : [])]));
  }

  async stop(): Promise<void> {
    this.#states.stop();
  }

  /** The breakers' timed half-open, for the workflow processor: its HalfOpen decided here, so this process's state has it at once. */
  timers(): ServiceWorkflows {
    const deliver = async ({ stream, command, commandId }: { stream: string; command: BackendCommand; commandId: string }) => {
      const outcome = await this.#handler.handle(stream, command, backendDecider, { commandId });
      const entry = this.#states.all().find((e) => e.streamId === stream);
      if (entry) this.#states.set(entry, outcome.state, outcome.version);
    };
    return { workflows: [breakerHalfOpenWorkflow], deliver: { [breakerHalfOpenWorkflow.name]: deliver } };
  }

  // --- the request path ---------------------------------------------------------------------------

  /**
   * May this request call the backend now (`breakerAdmission`)? A closed breaker answers at once with
   * its shared call object. An open one throws 503 `circuit_open` (with `retry_after_seconds` and
   * `Retry-After`) until its cooldown is over; then the first request to ask, across every process,
   * becomes the probe (a promise: it is decided against the stream) and the others are refused.
   */
  admit(modelId: string, backend: BackendKind = 'completion'): BackendCall | Promise<BackendCall> {
    const entry = this.#states.find(modelId, backend);
    if (entry === undefined) return noBreaker;
    if (entry.state.breaker === 'closed') return entry.closedCall;
    const now = this.#now();
    const admission = breakerAdmission(entry.state, new Date(now).toISOString());
    if (admission.verdict === 'flow') return entry.closedCall;
    if (admission.verdict === 'probe') return this.#startProbe(entry);
    throw this.#circuitOpen(entry, Date.parse(admission.retryAt) - now);
  }

  async #startProbe(entry: Entry): Promise<BackendCall> {
    const probeId = randomUUID();
    const command: BackendCommand = { type: 'StartProbe', backend: entry.backend, probeId, now: this.#iso(), probeLeaseMs: this.#settings.probeLeaseMs };
    let outcome: Outcome<BackendState, BackendEvent, BackendRejection>;
    try {
      // Durable before the probe goes: of two processes racing, the one whose append lost is decided again, and refused.
      outcome = await this.#handler.handle(entry.streamId, command, backendDecider, { commandId: `probe:${probeId}` });
    } catch (error) {
      this.#onError(error, `starting a probe of ${entry.streamId}`);
      throw apiError('store_unavailable', 'the event store is unreachable: the backend\'s probe cannot be coordinated');
    }
    this.#states.set(entry, outcome.state, outcome.version);
    if (outcome.accepted) return this.#probeCall(entry, probeId);
    if (outcome.rejection.rejected === 'breaker_closed') return entry.closedCall;
    throw this.#circuitOpen(entry, Date.parse(String(outcome.rejection.details?.retry_at ?? '')) - this.#now());
  }

  #probeCall(entry: Entry, probeId: string): BackendCall {
    const success = (): BackendCommand => ({ type: 'RecordSuccess', backend: entry.backend, now: this.#iso(), probeId });
    return {
      succeeded: () => this.#states.record(entry, success()),
      failed: (error) => {
        const outcome = backendOutcomeOf(error);
        // The engine answered (a 4xx): it is up. Nothing learnt (the client left): the probe's lease runs out.
        if (outcome === 'answered') this.#states.record(entry, success());
        else if (outcome !== null) this.#states.record(entry, this.#failure(entry, outcome, probeId));
      },
    };
  }

  /** A request's outcome while closed: sent as a command only when the decider's rule says it changes something. */
  #closedCall(entry: Entry): BackendCall {
    const succeeded = () => {
      if (successCounts(entry.state, null)) this.#states.record(entry, { type: 'RecordSuccess', backend: entry.backend, now: this.#iso(), probeId: null });
    };
    return {
      succeeded,
      failed: (error) => {
        const outcome = backendOutcomeOf(error);
        if (outcome === 'answered') succeeded();
        else if (outcome !== null && failureCounts(entry.state, null)) this.#states.record(entry, this.#failure(entry, outcome, null));
      },
    };
  }

  #failure(entry: Entry, kind: string, probeId: string | null): BackendCommand {
    return { type: 'RecordFailure', backend: entry.backend, kind, now: this.#iso(), failureThreshold: this.#settings.failureThreshold, cooldownMs: this.#settings.cooldownMs, probeId };
  }

  #circuitOpen(entry: Entry, waitMs: number): ApiError {
    const seconds = Math.max(1, Math.ceil(waitMs / 1000));
    const which = entry.backend === 'completion' ? '' : ` ${entry.backend}`;
    return apiError('circuit_open', `the${which} backend of model ${entry.modelId} failed repeatedly and its circuit breaker is open; retry after ${seconds} s`, {
      retryAfter: seconds,
      fields: { retry_after_seconds: seconds },
      headers: this.#upstreamHeaders(entry.modelId),
    });
  }

  // --- boot stages (platforms publish them), reads (health, metrics, status) -----------------------

  /** Publishes a backend's boot stage; appends only when it differs from the last one published. */
  async publishBootStage(modelId: string, backend: BackendKind, stage: BootStage, reason: string | null = null): Promise<void> {
    const entry = this.#states.entry(modelId, backend);
    const outcome = await this.#handler.handle(entry.streamId, { type: 'PublishBootStage', backend, stage, now: this.#iso(), reason } satisfies BackendCommand, backendDecider);
    this.#states.set(entry, outcome.state, outcome.version);
  }

  /** One backend as this process knows it now (null: not tracked). */
  snapshot(modelId: string, backend: BackendKind = 'completion'): BackendSnapshot | null {
    const entry = this.#states.find(modelId, backend);
    return entry ? snapshotOf(entry) : null;
  }

  /** Every tracked backend. */
  snapshots(): BackendSnapshot[] {
    return this.#states.all().map(snapshotOf);
  }

  #iso(): string {
    return new Date(this.#now()).toISOString();
  }
}
