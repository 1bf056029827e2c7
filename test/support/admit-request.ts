/** A request as the completion route hands it to `Metering.admit`, for tests and benches that drive the metering directly. */
import { randomUUID } from 'node:crypto';
import type { AdmitRequest } from '../../src/metering/index.ts';
import type { KeyBudgetValues } from '../../events/key.ts';

export const unlimitedBudgets: KeyBudgetValues = { monthly_token_budget: null, daily_token_budget: null, monthly_input_token_budget: null, monthly_output_token_budget: null, monthly_harvest_jobs: null };

/** An active key's request with a fresh request id: 5 prompt tokens, one choice, the production limits unless given. */
export function admitRequest(
  keyId: string,
  options: { budgets?: Partial<KeyBudgetValues>; maxTokens?: number; limits?: Partial<AdmitRequest['limits']>; email?: string; model?: string } = {},
): AdmitRequest {
  const key = { keyId, status: 'active' as const, budgets: { ...unlimitedBudgets, ...options.budgets } };
  const maxTokens = options.maxTokens ?? 16;
  return {
    key: async () => key,
    keyId,
    facts: { request_id: randomUUID(), key_prefix: keyId, email: options.email ?? `${keyId}@example.org`, client_ip: null, endpoint: '/v1/completions', model: options.model ?? 'ref-byte', user: null, workload: null },
    inputTokens: 5,
    maxTokens,
    maxTokensRequested: maxTokens,
    choices: 1,
    limits: { maxActive: 16, maxQueued: 64, perMinute: 600, ...options.limits },
    signal: new AbortController().signal,
  };
}
