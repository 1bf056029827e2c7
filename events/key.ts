/** Stream `key-<keyId>`: an API key's life. The key id is its public prefix; only a hash of the secret is stored. */
import { defineEvent, eventCatalogue, Type, type EventOf } from '../src/event-sourcing/index.ts';
import { Instant } from './shapes.ts';

const Budget = Type.Union([Type.Integer({ minimum: 0 }), Type.Null()], { description: 'tokens (jobs for harvests); null: unlimited' });

export const KeyBudgets = Type.Object(
  {
    monthly_token_budget: Budget,
    daily_token_budget: Budget,
    monthly_input_token_budget: Budget,
    monthly_output_token_budget: Budget,
    monthly_harvest_jobs: Budget,
  },
  { additionalProperties: false },
);

export const KeyIssued = defineEvent(
  'KeyIssued',
  Type.Object(
    {
      key_id: Type.String({ minLength: 1 }),
      /** sha256 of the secret part, hex. The full key is shown once, in the admin API's answer, and never stored. */
      secret_sha256: Type.String({ pattern: '^[0-9a-f]{64}$' }),
      email: Type.String({ minLength: 1 }),
      user_id: Type.String({ minLength: 1 }),
      budgets: KeyBudgets,
      at: Instant,
    },
    { additionalProperties: false },
  ),
);
export const KeyPaused = defineEvent('KeyPaused', Type.Object({ key_id: Type.String(), at: Instant }, { additionalProperties: false }));
export const KeyResumed = defineEvent('KeyResumed', Type.Object({ key_id: Type.String(), at: Instant }, { additionalProperties: false }));
export const KeyRevoked = defineEvent('KeyRevoked', Type.Object({ key_id: Type.String(), at: Instant }, { additionalProperties: false }));
export const KeyBudgetsChanged = defineEvent(
  'KeyBudgetsChanged',
  Type.Object({ key_id: Type.String(), budgets: Type.Partial(KeyBudgets), at: Instant }, { additionalProperties: false }),
);

export const keyEvents = eventCatalogue('key', [KeyIssued, KeyPaused, KeyResumed, KeyRevoked, KeyBudgetsChanged]);
export type KeyEvent = EventOf<typeof KeyIssued> | EventOf<typeof KeyPaused> | EventOf<typeof KeyResumed> | EventOf<typeof KeyRevoked> | EventOf<typeof KeyBudgetsChanged>;
export type KeyBudgetValues = EventOf<typeof KeyIssued>['data']['budgets'];

export const keyStream = (keyId: string): string => `key-${keyId}`;
