export { EngineClient, type BackendTarget, type EngineResponse, type EngineClientOptions } from './client.ts';
export { parseEngineError, engineErrorToApiError, type EngineFailure } from './errors.ts';
