/** The key decider: issue, pause, resume, revoke, change budgets. Stream `key-<keyId>`. */
import { reject, type Decider, type Rejection } from '../src/event-sourcing/index.ts';
import { KeyBudgetsChanged, KeyIssued, KeyPaused, KeyResumed, KeyRevoked, keyEvents, type KeyBudgetValues, type KeyEvent } from '../events/key.ts';

export type KeyStatus = 'active' | 'paused' | 'revoked';

export type KeyState =
  | { readonly status: 'none' }
  | {
      readonly status: KeyStatus;
      readonly keyId: string;
      readonly secretSha256: string;
      readonly email: string;
      readonly userId: string;
      readonly budgets: KeyBudgetValues;
      readonly issuedAt: string;
    };

export type KeyCommand =
  | { type: 'IssueKey'; keyId: string; secretSha256: string; email: string; userId: string; budgets: KeyBudgetValues; now: string }
  | { type: 'PauseKey'; now: string }
  | { type: 'ResumeKey'; now: string }
  | { type: 'RevokeKey'; now: string }
  | { type: 'ChangeBudgets'; budgets: Partial<KeyBudgetValues>; now: string };

export type KeyRejection = Rejection<'key_exists' | 'key_not_found' | 'key_revoked'>;

export const keyDecider: Decider<KeyState, KeyCommand, KeyEvent, KeyRejection> = {
  events: keyEvents,
  initialState: () => ({ status: 'none' }),
  evolve(state, event) {
    switch (event.type) {
      case 'KeyIssued': {
        const d = event.data;
        return { status: 'active', keyId: d.key_id, secretSha256: d.secret_sha256, email: d.email, userId: d.user_id, budgets: d.budgets, issuedAt: d.at };
      }
      case 'KeyPaused':
        return state.status === 'none' ? state : { ...state, status: 'paused' };
      case 'KeyResumed':
        return state.status === 'none' ? state : { ...state, status: 'active' };
      case 'KeyRevoked':
        return state.status === 'none' ? state : { ...state, status: 'revoked' };
      case 'KeyBudgetsChanged':
        return state.status === 'none' ? state : { ...state, budgets: { ...state.budgets, ...event.data.budgets } };
    }
  },
  decide(command, state) {
    if (command.type === 'IssueKey') {
      if (state.status !== 'none') return reject('key_exists', `key ${command.keyId} already exists`);
      return KeyIssued({ key_id: command.keyId, secret_sha256: command.secretSha256, email: command.email, user_id: command.userId, budgets: command.budgets, at: command.now });
    }
    if (state.status === 'none') return reject('key_not_found', 'no such key');
    const key_id = state.keyId;
    switch (command.type) {
      case 'PauseKey':
        if (state.status === 'revoked') return reject('key_revoked', `key ${key_id} is revoked`);
        return state.status === 'paused' ? [] : KeyPaused({ key_id, at: command.now });
      case 'ResumeKey':
        if (state.status === 'revoked') return reject('key_revoked', `key ${key_id} is revoked; revocation is final`);
        return state.status === 'active' ? [] : KeyResumed({ key_id, at: command.now });
      case 'RevokeKey':
        return state.status === 'revoked' ? [] : KeyRevoked({ key_id, at: command.now });
      case 'ChangeBudgets': {
        if (state.status === 'revoked') return reject('key_revoked', `key ${key_id} is revoked`);
        // A field left undefined is not a change: JSON would drop it from the stored event but memory would keep it.
        const changed = Object.fromEntries(Object.entries(command.budgets).filter(([name, value]) => value !== undefined && state.budgets[name as keyof KeyBudgetValues] !== value));
        return Object.keys(changed).length === 0 ? [] : KeyBudgetsChanged({ key_id, budgets: changed, at: command.now });
      }
      default: {
        const unhandled: never = command;
        throw new Error(`unknown key command ${JSON.stringify(unhandled)}`);
      }
    }
  },
};
