// The platform port: where a backend's engine runs and how it is brought up. Shared by the face and
// the adapters (static.ts, local-process.ts), so neither imports the other.

/** The stages of a cold boot, in the order a platform publishes them; `failed` ends a boot that did not make it. */
export const bootStages = ['waiting_for_gpu', 'container_started', 'weights_loading', 'weights_loaded', 'engine_ready', 'serving', 'failed'] as const;
export type BootStage = (typeof bootStages)[number];

/** Which engine of a model: the one serving completions, or one serving activations. */
export type BackendKind = 'completion' | 'activation';

/** Told of every stage a platform publishes (wired to the backend service's `publishBootStage`). */
export type BootStageListener = (modelId: string, backend: BackendKind, stage: BootStage, reason: string | null) => void;

export interface PublishedStage {
  stage: BootStage;
  /** Epoch milliseconds. */
  at: number;
  reason: string | null;
}

/** A boot in progress, shared by every request that came while the model was cold. */
export interface Boot {
  /**
   * Resolves once the platform has acknowledged the boot (the container started). Rejects with
   * `BootStalled` when it did not within the platform's acknowledgement timeout, or `BootFailed`.
   */
  readonly acknowledged: Promise<void>;
  /** Resolves once the engine serves; rejects with `BootStalled` or `BootFailed`. */
  readonly ready: Promise<void>;
}

export class BootFailed extends Error {
  override name = 'BootFailed';
}

/** The boot was not acknowledged in time: the contract's 503 `platform_cold_boot`. */
export class BootStalled extends Error {
  override name = 'BootStalled';
}

export interface Platform {
  readonly modelId: string;
  readonly kind: 'static' | 'local-process';
  /** The engine's base URL now; null while no engine runs. */
  readonly url: string | null;
  /** Null when an engine serves now; else the boot to wait out (started by this call when none was under way). */
  ensureRunning(): Boot | null;
  /** A request to this model is in flight until the returned function is called (holds off the idle stop). */
  hold(): () => void;
  /** Engines up and serving now: 0 or 1 for a local process; null when the platform cannot know (static). */
  runners(): number | null;
  /** The latest stage this platform published in this process, or null. */
  latestStage(): PublishedStage | null;
  /** Starts an engine ahead of any request (warm at start); resolves once it serves. */
  warmUp(): Promise<void>;
  /** The gateway is stopping: an engine that exits from now on is not restarted. */
  shuttingDown(): void;
  stop(): Promise<void>;
}
