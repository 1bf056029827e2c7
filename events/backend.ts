/**
 * Stream `backend-<modelId>` (a model's completion engine) and `backend-<modelId>:activation` (its
 * activation engine, when it has one of its own): one engine's circuit breaker and its boot stages.
 * A model id never holds a `:` (src/config's modelIdPattern), so the two can never collide, and both
 * fall in the `backend` category. Appends happen only when something changes: a success on a healthy
 * breaker appends nothing.
 */
import { defineEvent, eventCatalogue, Type, type EventOf } from '../src/event-sourcing/index.ts';
import { Instant, Nullable } from './shapes.ts';


/** Which engine of a model: the one serving completions, or a separate one serving activations. */
export const BackendKind = Type.Union([Type.Literal('completion'), Type.Literal('activation')]);
export type BackendKind = 'completion' | 'activation';

/**
 * What went wrong: the error code the gateway answered (`upstream_unreachable`,
 * `upstream_server_error` (a 5xx after retries), `engine_oom`, `engine_engine_dead`) or `timeout`.
 * A string, not a closed list, so that a later release may add a kind without a new event type.
 */
const FailureKind = Type.String({ minLength: 1, maxLength: 64 });

/** The stages of a cold boot, in the order a platform publishes them (`failed` ends a boot that did not make it). */
export const bootStages = ['waiting_for_gpu', 'container_started', 'weights_loading', 'weights_loaded', 'engine_ready', 'serving', 'failed'] as const;
export type BootStage = (typeof bootStages)[number];
export const BootStageName = Type.Union([
  Type.Literal('waiting_for_gpu'),
  Type.Literal('container_started'),
  Type.Literal('weights_loading'),
  Type.Literal('weights_loaded'),
  Type.Literal('engine_ready'),
  Type.Literal('serving'),
  Type.Literal('failed'),
]);

/** A call to the engine failed in a way that counts against it (never a 4xx, never a client that left). */
export const BackendFailed = defineEvent(
  'BackendFailed',
  Type.Object(
    {
      backend: BackendKind,
      kind: FailureKind,
      /** Failures in a row after this one (a success in between starts again from zero). */
      consecutive_failures: Type.Integer({ minimum: 1 }),
      at: Instant,
    },
    { additionalProperties: false },
  ),
);

/** A success after failures, while the breaker was closed: the count starts again from zero. */
export const BackendFailuresCleared = defineEvent(
  'BackendFailuresCleared',
  Type.Object({ backend: BackendKind, cleared_failures: Type.Integer({ minimum: 1 }), at: Instant }, { additionalProperties: false }),
);

/** The breaker opened: no request reaches the engine until `retry_at`, when one probe may go. */
export const BreakerOpened = defineEvent(
  'BreakerOpened',
  Type.Object(
    {
      backend: BackendKind,
      /** `failures`: the threshold was reached while closed; `probe_failed`: the half-open probe failed. */
      reason: Type.Union([Type.Literal('failures'), Type.Literal('probe_failed')]),
      consecutive_failures: Type.Integer({ minimum: 1 }),
      last_failure_kind: FailureKind,
      /** The threshold and the cooldown it was decided under (configuration may change later). */
      failure_threshold: Type.Integer({ minimum: 1 }),
      cooldown_ms: Type.Integer({ minimum: 0 }),
      retry_at: Instant,
      at: Instant,
    },
    { additionalProperties: false },
  ),
);

/** The cooldown is over: the next request is the probe (the breaker's timed half-open). */
export const BreakerHalfOpened = defineEvent('BreakerHalfOpened', Type.Object({ backend: BackendKind, at: Instant }, { additionalProperties: false }));

/**
 * One request, in one gateway process, became the half-open probe: every other request gets 503
 * until it ends or until `expires_at` (its process may have died), when another may probe.
 */
export const ProbeStarted = defineEvent(
  'ProbeStarted',
  Type.Object({ backend: BackendKind, probe_id: Type.String({ minLength: 1 }), expires_at: Instant, at: Instant }, { additionalProperties: false }),
);

/** The probe succeeded: requests flow again, failures counted from zero. */
export const BreakerClosed = defineEvent(
  'BreakerClosed',
  Type.Object({ backend: BackendKind, probe_id: Type.String({ minLength: 1 }), at: Instant }, { additionalProperties: false }),
);

/** A platform published a boot stage of this engine (only when it differs from the last one published). */
export const BootStagePublished = defineEvent(
  'BootStagePublished',
  Type.Object({ backend: BackendKind, stage: BootStageName, at: Instant, reason: Type.Optional(Nullable(Type.String({ maxLength: 1000 }))) }, { additionalProperties: false }),
);

export const backendEvents = eventCatalogue('backend', [BackendFailed, BackendFailuresCleared, BreakerOpened, BreakerHalfOpened, ProbeStarted, BreakerClosed, BootStagePublished]);
export type BackendEvent =
  | EventOf<typeof BackendFailed>
  | EventOf<typeof BackendFailuresCleared>
  | EventOf<typeof BreakerOpened>
  | EventOf<typeof BreakerHalfOpened>
  | EventOf<typeof ProbeStarted>
  | EventOf<typeof BreakerClosed>
  | EventOf<typeof BootStagePublished>;

const activationSuffix = ':activation';

/** `backend-<modelId>` for the completion engine, `backend-<modelId>:activation` for a separate activation engine. */
export const backendStream = (modelId: string, backend: BackendKind = 'completion'): string => `backend-${modelId}${backend === 'activation' ? activationSuffix : ''}`;

/** The model and engine a backend stream belongs to; null for another category's stream. */
export function backendStreamParts(streamId: string): { modelId: string; backend: BackendKind } | null {
  if (!streamId.startsWith('backend-')) return null;
  const rest = streamId.slice('backend-'.length);
  return rest.endsWith(activationSuffix) ? { modelId: rest.slice(0, -activationSuffix.length), backend: 'activation' } : { modelId: rest, backend: 'completion' };
}
