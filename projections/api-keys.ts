/**
 * `api_keys`: one row per key, its owner, status and budgets, from the key streams. Never the secret
 * nor its hash. Idempotent: an issue that finds its row does nothing; a status or budget change
 * writes the values its event carries, so replaying a stream's events in order ends on the same row.
 */
import { defineProjection, toStorableText, type Queryable } from '../src/event-sourcing/index.ts';
import { describeTable } from './table-comments.ts';
import { keyEvents, type KeyEvent } from '../events/key.ts';

const budgetColumns = ['monthly_token_budget', 'daily_token_budget', 'monthly_input_token_budget', 'monthly_output_token_budget', 'monthly_harvest_jobs'] as const;

async function setStatus(db: Queryable, keyId: string, status: 'active' | 'paused' | 'revoked', at: string): Promise<void> {
  // Revocation is final (the decider allows nothing after it); the guard keeps a replayed pause from undoing it.
  await db.query(`UPDATE api_keys SET status = $2, updated_at = $3 WHERE key_id = $1 AND (status <> 'revoked' OR $2 = 'revoked')`, [keyId, status, at]);
}

export const apiKeys = defineProjection<KeyEvent>({
  name: 'api_keys',
  tables: ['api_keys'],
  events: [keyEvents],
  async init(db) {
    await db.query(`CREATE TABLE IF NOT EXISTS api_keys (
      key_id text PRIMARY KEY,
      prefix text NOT NULL,
      email text NOT NULL,
      user_id text NOT NULL,
      status text NOT NULL CHECK (status IN ('active', 'paused', 'revoked')),
      monthly_token_budget bigint NULL,
      daily_token_budget bigint NULL,
      monthly_input_token_budget bigint NULL,
      monthly_output_token_budget bigint NULL,
      monthly_harvest_jobs bigint NULL,
      issued_at timestamptz NOT NULL,
      updated_at timestamptz NOT NULL
    )`);
    await db.query('CREATE INDEX IF NOT EXISTS api_keys_user_id ON api_keys (user_id)');
    await db.query('CREATE INDEX IF NOT EXISTS api_keys_email ON api_keys (email)');
    await describeTable(db, 'api_keys', 'One row per API key: its owner, status and budgets (projection api_keys, from the key streams). Never the secret nor its hash.', {
      key_id: 'Primary key; equal to prefix.',
      prefix: 'The key\'s public prefix (12 hex characters).',
      email: 'The owner\'s e-mail address.',
      user_id: 'The owning user (the e-mail when none was given); several keys may share it.',
      status: 'active, paused or revoked.',
      monthly_token_budget: 'Tokens (input + output) per UTC month; NULL = unlimited.',
      daily_token_budget: 'Tokens (input + output) per UTC day; NULL = unlimited.',
      monthly_input_token_budget: 'Input (prompt) tokens per UTC month; NULL = unlimited.',
      monthly_output_token_budget: 'Output (generated) tokens per UTC month; NULL = unlimited.',
      monthly_harvest_jobs: 'Harvest jobs per UTC month; NULL = unlimited.',
      issued_at: 'When the key was issued.',
      updated_at: 'The last status or budget change (issued_at until then).',
    });
  },
  handlers: {
    async KeyIssued(event, db) {
      const d = event.data;
      await db.query(
        `INSERT INTO api_keys (key_id, prefix, email, user_id, status, ${budgetColumns.join(', ')}, issued_at, updated_at)
         VALUES ($1, $1, $2, $3, 'active', $4, $5, $6, $7, $8, $9, $9)
         ON CONFLICT (key_id) DO NOTHING`,
        [d.key_id, toStorableText(d.email), toStorableText(d.user_id), ...budgetColumns.map((c) => d.budgets[c]), d.at],
      );
    },
    KeyPaused: (event, db) => setStatus(db, event.data.key_id, 'paused', event.data.at),
    KeyResumed: (event, db) => setStatus(db, event.data.key_id, 'active', event.data.at),
    KeyRevoked: (event, db) => setStatus(db, event.data.key_id, 'revoked', event.data.at),
    async KeyBudgetsChanged(event, db) {
      const changed = budgetColumns.filter((c) => c in event.data.budgets);
      if (changed.length === 0) return;
      const sets = changed.map((c, i) => `${c} = $${i + 3}`).join(', ');
      await db.query(`UPDATE api_keys SET ${sets}, updated_at = $2 WHERE key_id = $1`, [event.data.key_id, event.data.at, ...changed.map((c) => event.data.budgets[c] ?? null)]);
    },
  },
});
