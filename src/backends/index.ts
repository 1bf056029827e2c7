/** Backends: each engine's circuit breaker and boot stages, held in memory for the request path (see README.md). */
export { BackendService, type BackendServiceOptions, type TrackedModel } from './service.ts';
export { defaultBreakerSettings, type BackendCall, type BackendKind, type BackendSnapshot, type BootStage, type BreakerSettings, type BreakerStatus } from './types.ts';
