/**
 * The admin API's schemas, in one module: they validate the requests (compiled once, in
 * admin-keys.ts) and feed the OpenAPI document's "admin" section.
 */
import { Type, type Static } from 'typebox';

const Budget = Type.Union([Type.Integer({ minimum: 0, maximum: Number.MAX_SAFE_INTEGER }), Type.Null()], {
  description: 'Tokens (jobs for monthly_harvest_jobs); null means unlimited.',
});

export const budgetFields = ['monthly_token_budget', 'daily_token_budget', 'monthly_input_token_budget', 'monthly_output_token_budget', 'monthly_harvest_jobs'] as const;

const optionalBudgets = {
  monthly_token_budget: Type.Optional(Budget),
  daily_token_budget: Type.Optional(Budget),
  monthly_input_token_budget: Type.Optional(Budget),
  monthly_output_token_budget: Type.Optional(Budget),
  monthly_harvest_jobs: Type.Optional(Budget),
};

const budgets = {
  monthly_token_budget: Budget,
  daily_token_budget: Budget,
  monthly_input_token_budget: Budget,
  monthly_output_token_budget: Budget,
  monthly_harvest_jobs: Budget,
};

export const KeyPrefix = Type.String({ pattern: '^[0-9a-f]{12}$', description: 'The key\'s public prefix (12 lowercase hex characters); also its key_id.' });

export const CreateKeyRequest = Type.Object(
  {
    email: Type.String({ minLength: 3, maxLength: 254, pattern: '^[^\\s@]+@[^\\s@]+$', description: 'The key owner\'s e-mail address.' }),
    user_id: Type.Optional(Type.Union([Type.String({ minLength: 1, maxLength: 256 }), Type.Null()], { description: 'The owning user; defaults to the e-mail address. Several keys may share one user.' })),
    ...optionalBudgets,
  },
  { additionalProperties: false, description: 'Omitted budgets are unlimited (null).' },
);
export type CreateKeyRequest = Static<typeof CreateKeyRequest>;

export const ChangeBudgetsRequest = Type.Object(optionalBudgets, {
  additionalProperties: false,
  minProperties: 1,
  description: 'Only the budgets named change; null makes one unlimited.',
});
export type ChangeBudgetsRequest = Static<typeof ChangeBudgetsRequest>;

export const PrefixParams = Type.Object({ prefix: KeyPrefix });

export const AdminKey = Type.Object({
  prefix: KeyPrefix,
  key_id: Type.String({ description: 'Equal to prefix.' }),
  email: Type.String(),
  user_id: Type.String(),
  status: Type.Union([Type.Literal('active'), Type.Literal('paused'), Type.Literal('revoked')]),
  ...budgets,
  issued_at: Type.String({ format: 'date-time' }),
});
export type AdminKey = Static<typeof AdminKey>;

export const IssuedKey = Type.Object({
  key: Type.String({ description: 'The full key, svc_<prefix>_<secret>. Shown only in this answer; the service keeps only a hash of the secret.' }),
  ...AdminKey.properties,
});

export const KeyUsage = Type.Object(
  {
    period: Type.String({ description: 'The UTC month, YYYY-MM.' }),
    input_tokens: Type.Integer({ description: 'Prompt tokens charged this month (settled and expired reservations).' }),
    output_tokens: Type.Integer({ description: 'Completion tokens charged this month.' }),
    total_tokens: Type.Integer(),
    reserved_tokens: Type.Integer({ description: 'Tokens held by open reservations now.' }),
    requests: Type.Integer({ description: 'Settled requests this month.' }),
  },
  { description: 'From the key_usage projection (follows the log; may trail the latest requests by a moment).' },
);

export const AdminKeyWithUsage = Type.Object({ ...AdminKey.properties, usage: KeyUsage });

export const AdminKeyList = Type.Object({ object: Type.Literal('list'), data: Type.Array(AdminKeyWithUsage) });
