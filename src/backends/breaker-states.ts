/**
 * The breakers' states as this process holds them: every tracked backend's stream loaded through the
 * command handler at start, replaced by each decision this process makes, and read again when another
 * process appends to it (the handler's log subscription, within a second). Reading one is a map
 * lookup; an older state (a slow read) never replaces a newer one.
 */
import { backendDecider, type BackendCommand, type BackendState } from '../../deciders/backend.ts';
import { backendStream, type BackendKind } from '../../events/backend.ts';
import type { CommandHandler } from '../command-handler/index.ts';
import type { BackendCall, BackendSnapshot } from './types.ts';

export interface Entry {
  readonly modelId: string;
  readonly backend: BackendKind;
  readonly streamId: string;
  state: BackendState;
  /** The stream version `state` is at. */
  version: number;
  /** The call handed out while the breaker is closed (shared: nothing is allocated per request). */
  closedCall: BackendCall;
  reloading: Promise<void> | null;
  reloadAgain: boolean;
}

const streamPrefix = 'backend-';

export class BreakerStates {
  readonly #handler: CommandHandler;
  readonly #onError: (error: unknown, what: string) => void;
  readonly #closedCall: (entry: Entry) => BackendCall;
  readonly #byModel = { completion: new Map<string, Entry>(), activation: new Map<string, Entry>() };
  readonly #byStream = new Map<string, Entry>();
  #unlisten: (() => void) | null = null;

  constructor(handler: CommandHandler, onError: (error: unknown, what: string) => void, closedCall: (entry: Entry) => BackendCall) {
    this.#handler = handler;
    this.#onError = onError;
    this.#closedCall = closedCall;
  }

  /** Loads these backends' streams and follows the others' writes to them (joins the handler's log subscription). */
  async start(backends: readonly { modelId: string; backend: BackendKind }[]): Promise<void> {
    this.#unlisten ??= this.#handler.onForeignEvent((event) => {
      if (!event.streamId.startsWith(streamPrefix)) return;
      const entry = this.#byStream.get(event.streamId);
      if (entry) this.reload(entry);
    });
    await Promise.all(backends.map((b) => this.#load(this.entry(b.modelId, b.backend))));
    await this.#handler.followLog((error) => this.#onError(error, 'log subscription'));
  }

  stop(): void {
    this.#unlisten?.();
    this.#unlisten = null;
  }

  /** A tracked backend (undefined: not tracked). */
  find(modelId: string, backend: BackendKind): Entry | undefined {
    return this.#byModel[backend].get(modelId);
  }

  /** A backend's entry, tracked from now on. */
  entry(modelId: string, backend: BackendKind): Entry {
    let entry = this.#byModel[backend].get(modelId);
    if (!entry) {
      const created: Entry = { modelId, backend, streamId: backendStream(modelId, backend), state: backendDecider.initialState(), version: 0, closedCall: { succeeded() {}, failed() {} }, reloading: null, reloadAgain: false };
      created.closedCall = this.#closedCall(created);
      entry = created;
      this.#byModel[backend].set(modelId, entry);
      this.#byStream.set(entry.streamId, entry);
    }
    return entry;
  }

  all(): Entry[] {
    return [...this.#byStream.values()];
  }

  /** Another process wrote the stream: read it again (one read at a time; one more if it moved meanwhile). */
  reload(entry: Entry): void {
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
  record(entry: Entry, command: BackendCommand): void {
    void this.#handler.decide(entry.streamId, command, backendDecider).then(
      (pending) => {
        this.set(entry, pending.outcome.state, pending.outcome.version);
        pending.durable.then(
          (outcome) => this.set(entry, outcome.state, outcome.version),
          (error) => {
            this.#onError(error, `recording ${command.type} on ${entry.streamId}`);
            this.reload(entry);
          },
        );
      },
      (error) => this.#onError(error, `recording ${command.type} on ${entry.streamId}`),
    );
  }

  set(entry: Entry, state: BackendState, version: number): void {
    if (version < entry.version) return;
    entry.state = state;
    entry.version = version;
  }

  async #load(entry: Entry): Promise<void> {
    const { state, version } = await this.#handler.load(entry.streamId, backendDecider);
    this.set(entry, state, version);
  }
}

export function snapshotOf(entry: Entry): BackendSnapshot {
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
