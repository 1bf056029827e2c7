export { EngineClient, type BackendTarget, type EngineResponse, type EngineClientOptions } from './client.ts';
export { parseEngineError, engineErrorToApiError, backendOutcomeOf, type EngineFailure } from './errors.ts';
