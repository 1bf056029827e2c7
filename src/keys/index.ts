/** API keys: issue, pause, resume, revoke, budgets, and bearer-token authentication against cached state. */
export { KeyService, type Authentication, type KeyCommandMetadata, type KeyServiceOptions } from './service.ts';
export { bearerToken, mintKey, parseKey, prefixPattern, secretMatches, tokensMatch } from './secret.ts';
export type { IssuedKey, IssueKeyInput, KeyBudgetValues, KeyStatus, KeyView } from './types.ts';
