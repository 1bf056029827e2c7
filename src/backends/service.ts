/**
 * The breakers on the request path. Every configured backend's state is held in memory: loaded
 * through the command handler at start, replaced by each decision this process makes, and read
 * again when another process appends to its stream (the handler's log subscription, within a
 * second). Asking whether a closed breaker lets a call through is one map lookup and a field read:
 * no I/O, no allocation. Outcomes are recorded as commands only when they may change something (a
 * failure, or a success after failures, or a probe's end); the decider appends nothing otherwise.
 */
import { randomUUID } from 'node:crypto';
import { backendDecider, breakerAdmission, failureCounts, halfOpenBreakers, successCounts, type BackendCommand, type BackendRejection, type BackendState } from '../../deciders/backend.ts';
import { backendStream, type BackendEvent, type BackendKind, type BootStage } from '../../events/backend.ts';
import type { CommandHandler, Outcome } from '../command-handler/index.ts';
import { backendOutcomeOf } from '../engine-client/index.ts';
import { apiError, type ApiError } from '../errors/index.ts';
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

interface Entry {
  readonly modelId: string;
  readonly backend: BackendKind;
  readonly streamId: string;
  state: BackendState;
  /** The stream version `state` is at: an older state (a slow read) never replaces a newer one. */
  version: number;
  /** The call handed out while the breaker is closed (shared: nothing is allocated per request). */
  readonly closedCall: BackendCall;
  reloading: Promise<void> | null;
  reloadAgain: boolean;
  halfOpenTimer: NodeJS.Timeout | null;
}

const noBreaker: BackendCall = { succeeded() {}, failed() {} };
const streamPrefix = 'backend-';

export class BackendService {
  readonly #handler: CommandHandler;
  readonly #settings: BreakerSettings;
  readonly #now: () => number;
  readonly #upstreamHeaders: (modelId: string) => Record<string, string>;
  readonly #onError: (error: unknown, what: string) => void;
  readonly #completion = new Map<string, Entry>();
  readonly #activation = new Map<string, Entry>();
  readonly #byStream = new Map<string, Entry>();
  #unlisten: (() => void) | null = null;
  #stopped = false;

  constructor(options: BackendServiceOptions) {
    this.#handler = options.handler;
    this.#settings = { ...defaultBreakerSettings, ...options.settings };
    this.#now = options.now ?? Date.now;
    this.#upstreamHeaders = options.upstreamHeaders ?? (() => ({}));
    this.#onError = options.onError ?? (() => {});
  }

  get settings(): Readonly<BreakerSettings> {
    return this.#settings;
  }

  /** Loads every tracked backend's stream and follows the others' writes to them (joins the handler's log subscription). */
  async start(models: readonly TrackedModel[]): Promise<void> {
    this.#unlisten ??= this.#handler.onForeignEvent((event) => {
      if (!event.streamId.startsWith(streamPrefix)) return;
      const entry = this.#byStream.get(event.streamId);
      if (entry) this.#reload(entry);
    });
    const entries = models.flatMap((m) => [this.#entry(m.id, 'completion'), ...(m.activation ? [this.#entry(m.id, 'activation')] : [])]);
    await Promise.all(entries.map((e) => this.#load(e)));
    await this.#handler.followLog((error) => this.#onError(error, 'log subscription'));
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    this.#unlisten?.();
    this.#unlisten = null;
    for (const entry of this.#byStream.values()) if (entry.halfOpenTimer) clearTimeout(entry.halfOpenTimer);
  }

  // --- the request path ---------------------------------------------------------------------------

  /**
   * May this request call the backend now? A closed breaker answers at once with its shared call
   * object. An open one throws 503 `circuit_open` (with `retry_after_seconds` and `Retry-After`)
   * until its cooldown is over; then the first request to ask, across every process, becomes the
   * probe (a promise: it is decided against the stream) and the others are refused.
   */
  admit(modelId: string, backend: BackendKind = 'completion'): BackendCall | Promise<BackendCall> {
    const entry = (backend === 'completion' ? this.#completion : this.#activation).get(modelId);
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
    this.#set(entry, outcome.state, outcome.version);
    if (outcome.accepted) return this.#probeCall(entry, probeId);
    if (outcome.rejection.rejected === 'breaker_closed') return entry.closedCall;
    const retryAt = String(outcome.rejection.details?.retry_at ?? '');
    throw this.#circuitOpen(entry, Date.parse(retryAt) - this.#now());
  }

  #probeCall(entry: Entry, probeId: string): BackendCall {
    const success = (): BackendCommand => ({ type: 'RecordSuccess', backend: entry.backend, now: this.#iso(), probeId });
    return {
      succeeded: () => this.#record(entry, success()),
      failed: (error) => {
        const outcome = backendOutcomeOf(error);
        // The engine answered (a 4xx): it is up. Nothing learnt (the client left): the probe's lease runs out.
        if (outcome === 'answered') this.#record(entry, success());
        else if (outcome !== null) this.#record(entry, this.#failure(entry, outcome, probeId));
      },
    };
  }

  /** A request's outcome while closed: sent as a command only when the decider's rule says it changes something. */
  #closedCall(entry: Entry): BackendCall {
    const succeeded = () => {
      if (successCounts(entry.state, null)) this.#record(entry, { type: 'RecordSuccess', backend: entry.backend, now: this.#iso(), probeId: null });
    };
    return {
      succeeded,
      failed: (error) => {
        const outcome = backendOutcomeOf(error);
        if (outcome === 'answered') succeeded();
        else if (outcome !== null && failureCounts(entry.state, null)) this.#record(entry, this.#failure(entry, outcome, null));
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

  // --- boot stages (platforms publish them) --------------------------------------------------------

  /** Publishes a backend's boot stage; appends only when it differs from the last one published. */
  async publishBootStage(modelId: string, backend: BackendKind, stage: BootStage, reason: string | null = null): Promise<void> {
    const entry = this.#entry(modelId, backend);
    const outcome = await this.#handler.handle(entry.streamId, { type: 'PublishBootStage', backend, stage, now: this.#iso(), reason } satisfies BackendCommand, backendDecider);
    this.#set(entry, outcome.state, outcome.version);
  }

  // --- reads (health, metrics, status) -------------------------------------------------------------

  /** One backend as this process knows it now (null: not tracked). */
  snapshot(modelId: string, backend: BackendKind = 'completion'): BackendSnapshot | null {
    const entry = (backend === 'completion' ? this.#completion : this.#activation).get(modelId);
    return entry ? snapshotOf(entry) : null;
  }

  /** Every tracked backend. */
  snapshots(): BackendSnapshot[] {
    return [...this.#byStream.values()].map(snapshotOf);
  }

  // --- state ----------------------------------------------------------------------------------------

  #entry(modelId: string, backend: BackendKind): Entry {
    const byModel = backend === 'completion' ? this.#completion : this.#activation;
    let entry = byModel.get(modelId);
    if (!entry) {
      const created: Entry = {
        modelId,
        backend,
        streamId: backendStream(modelId, backend),
        state: backendDecider.initialState(),
        version: 0,
        closedCall: noBreaker,
        reloading: null,
        reloadAgain: false,
        halfOpenTimer: null,
      };
      (created as { closedCall: BackendCall }).closedCall = this.#closedCall(created);
      entry = created;
      byModel.set(modelId, entry);
      this.#byStream.set(entry.streamId, entry);
    }
    return entry;
  }

  async #load(entry: Entry): Promise<void> {
    const { state, version } = await this.#handler.load(entry.streamId, backendDecider);
    this.#set(entry, state, version);
  }

  /** Another process wrote the stream: read it again (one read at a time; one more if it moved meanwhile). */
  #reload(entry: Entry): void {
    if (entry.reloading) {
      entry.reloadAgain = true;
      return;
    }
    entry.reloading = (async () => {
      do {
        entry.reloadAgain = false;
        await this.#load(entry);
      } while (entry.reloadAgain);
    })()
      .catch((error) => this.#onError(error, `reading ${entry.streamId}`))
      .finally(() => {
        entry.reloading = null;
      });
  }

  /** A decision that may change something: decided in memory now (this process sees it at once), durable alongside. */
  #record(entry: Entry, command: BackendCommand): void {
    void this.#handler.decide(entry.streamId, command, backendDecider).then(
      (pending) => {
        this.#set(entry, pending.outcome.state, pending.outcome.version);
        pending.durable.then(
          (outcome) => this.#set(entry, outcome.state, outcome.version),
          (error) => {
            this.#onError(error, `recording ${command.type} on ${entry.streamId}`);
            this.#reload(entry);
          },
        );
      },
      (error) => this.#onError(error, `recording ${command.type} on ${entry.streamId}`),
    );
  }

  #set(entry: Entry, state: BackendState, version: number): void {
    if (version < entry.version) return;
    entry.state = state;
    entry.version = version;
    this.#scheduleHalfOpen(entry);
  }

  /** The timed half-open (deciders/backend.ts halfOpenBreakers), run when the cooldown of an open breaker ends. */
  #scheduleHalfOpen(entry: Entry): void {
    if (entry.halfOpenTimer) clearTimeout(entry.halfOpenTimer);
    entry.halfOpenTimer = null;
    const { breaker, retryAt } = entry.state;
    if (this.#stopped || breaker !== 'open' || retryAt === null) return;
    entry.halfOpenTimer = setTimeout(() => {
      entry.halfOpenTimer = null;
      const due = halfOpenBreakers({ now: this.#iso() }, [{ modelId: entry.modelId, backend: entry.backend, state: entry.state }]);
      if (due.length === 0) return this.#scheduleHalfOpen(entry); // the timer fired early
      for (const { stream, command, commandId } of due) {
        void this.#handler.handle(stream, command, backendDecider, { commandId }).then(
          (outcome) => this.#set(entry, outcome.state, outcome.version),
          (error) => this.#onError(error, `half-opening ${stream}`),
        );
      }
    }, Math.max(0, Date.parse(retryAt) - this.#now()) + 5);
    entry.halfOpenTimer.unref();
  }

  #iso(): string {
    return new Date(this.#now()).toISOString();
  }
}

function snapshotOf(entry: Entry): BackendSnapshot {
  const s = entry.state;
  return {
    modelId: entry.modelId,
    backend: entry.backend,
    breaker: s.breaker,
    consecutiveFailures: s.consecutiveFailures,
    lastFailureKind: s.lastFailureKind,
    lastFailureAt: s.lastFailureAt,
    openedAt: s.openedAt,
    retryAt: s.retryAt,
    boot: s.boot,
  };
}
