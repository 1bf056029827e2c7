export { ApiError, apiError, codesAnsweredWith, errorCatalogue, type ErrorCode, type ApiErrorOptions } from './catalogue.ts';
