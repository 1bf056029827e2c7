export { buildApp, maxBodyBytes, exposedHeaders, type AppOptions } from './app.ts';
export { createLogger, type Logger } from './logger.ts';
export { healthBody, HealthBody, BackendHealth, type HealthSources } from './health.ts';
export { sendApiError, toApiError } from './error-handler.ts';
