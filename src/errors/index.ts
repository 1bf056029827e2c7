export { ApiError, apiError, errorCatalogue, type ErrorCode, type ApiErrorOptions } from './catalogue.ts';
