import type { BackendKind, BootStage } from '../../events/backend.ts';
import type { BreakerStatus } from '../../deciders/backend.ts';

export type { BackendKind, BootStage, BreakerStatus };

/** The breaker's rules, from configuration (src/config: SVC_BREAKER_*). */
export interface BreakerSettings {
  /** Failures in a row that open a closed breaker (default 5). */
  failureThreshold: number;
  /** How long an open breaker refuses every request before one probe may go (default 60 s). */
  cooldownMs: number;
  /** How long a probe holds the half-open breaker before another request may probe (its process may have died; default 30 s). */
  probeLeaseMs: number;
}

export const defaultBreakerSettings: BreakerSettings = { failureThreshold: 5, cooldownMs: 60_000, probeLeaseMs: 30_000 };

/**
 * One engine call let through by the breaker. Exactly one of its methods is called when the call is
 * over (calling none is allowed too: nothing was learnt). A closed breaker's call is a shared object:
 * reporting on it costs nothing when nothing changes.
 */
export interface BackendCall {
  /** The engine answered (a 2xx's headers arrived). */
  succeeded(): void;
  /** The call failed with this error (an ApiError from the engine client, say); only a backend's fault counts (src/engine-client backendOutcomeOf). */
  failed(error: unknown): void;
}

/** One backend's breaker and boot stage as /health, /metrics and the status route read them (from memory). */
export interface BackendSnapshot {
  modelId: string;
  backend: BackendKind;
  breaker: BreakerStatus;
  consecutiveFailures: number;
  lastFailureKind: string | null;
  lastFailureAt: string | null;
  openedAt: string | null;
  /** While open: when one probe may go. */
  retryAt: string | null;
  boot: { stage: BootStage; at: string; reason: string | null } | null;
}
