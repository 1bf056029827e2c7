/** What the keys folder hands out: a key's public view, the answer to an issue, an authenticated caller. */
import type { KeyBudgetValues } from '../../events/key.ts';
import type { KeyStatus } from '../../deciders/key.ts';

export type { KeyBudgetValues } from '../../events/key.ts';
export type { KeyStatus } from '../../deciders/key.ts';

/** A key as the service knows it: never its secret, nor the secret's hash. */
export interface KeyView {
  readonly prefix: string;
  /** Equal to the prefix. */
  readonly keyId: string;
  readonly email: string;
  readonly userId: string;
  readonly status: KeyStatus;
  readonly budgets: KeyBudgetValues;
  readonly issuedAt: string;
}

/** The answer to issuing a key: the full key, shown this once. */
export interface IssuedKey {
  /** `svc_<prefix>_<secret>`: never stored, never logged. */
  readonly key: string;
  readonly view: KeyView;
}

export interface IssueKeyInput {
  email: string;
  /** Defaults to the e-mail address. */
  userId?: string | null;
  budgets?: Partial<KeyBudgetValues>;
}
