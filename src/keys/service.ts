/**
 * Keys over the command handler: issue, pause, resume, revoke, change budgets, and authenticate a
 * bearer token against the cached key state (no database round trip once a key is cached).
 *
 * Other gateway processes may change a key: a subscription to the global log forgets the cached
 * state of every key stream another event touched, so the next request reloads it.
 */
import { keyDecider, type KeyCommand, type KeyState } from '../../deciders/key.ts';
import { keyStream } from '../../events/key.ts';
import type { CommandHandler } from '../command-handler/index.ts';
import { apiError, type ApiError } from '../errors/index.ts';
import type { Subscription } from '../store/index.ts';
import { bearerToken, mintKey, parseKey, prefixPattern, secretMatches } from './secret.ts';
import type { IssuedKey, IssueKeyInput, KeyBudgetValues, KeyView } from './types.ts';

export interface KeyServiceOptions {
  handler: CommandHandler;
  /** The clock commands are stamped with (tests pin it). */
  now?: () => Date;
  /** Told when the handler's log subscription fails a read (it retries by itself), if this service starts it. */
  onError?: (error: unknown) => void;
}

/** Outcome of authenticating a bearer token; `prefix` is set whenever the token named an existing key. */
export type Authentication = { ok: true; key: KeyView; prefix: string } | { ok: false; error: ApiError; prefix?: string };

/** Metadata recorded on every key event (never the key or its secret). */
export interface KeyCommandMetadata {
  request_id?: string;
  actor?: string;
}

const unlimited: KeyBudgetValues = {
  monthly_token_budget: null,
  daily_token_budget: null,
  monthly_input_token_budget: null,
  monthly_output_token_budget: null,
  monthly_harvest_jobs: null,
};

const keyStreamPrefix = 'key-';

export class KeyService {
  readonly #handler: CommandHandler;
  readonly #now: () => Date;
  readonly #onError?: (error: unknown) => void;
  /** Bumped for a key stream each time the log shows it changed: a load that overlapped one is redone. */
  readonly #epochs = new Map<string, number>();
  /** One view per cached state object, so authenticating a cached key allocates nothing. */
  readonly #views = new WeakMap<KeyState, KeyView>();
  #following: Subscription | null = null;
  #unlisten: (() => void) | null = null;

  constructor(options: KeyServiceOptions) {
    this.#handler = options.handler;
    this.#now = options.now ?? (() => new Date());
    this.#onError = options.onError;
  }

  /**
   * Joins the command handler's log subscription (one per process): a key event another process
   * appended drops that key's cached state, and a load it overlapped is redone.
   */
  async start(): Promise<void> {
    if (this.#unlisten) return;
    this.#unlisten = this.#handler.onForeignEvent((event) => {
      if (event.streamId.startsWith(keyStreamPrefix)) this.#changed(event.streamId);
    });
    this.#following = await this.#handler.followLog(this.#onError);
  }

  /** Resolves once every key change committed before the call has reached this process's cache. */
  async caughtUp(): Promise<void> {
    await this.#following?.caughtUp();
  }

  /** Stops listening; the log subscription is the handler's (the store's close ends it). */
  async stop(): Promise<void> {
    this.#unlisten?.();
    this.#unlisten = null;
  }

  // --- authentication --------------------------------------------------------------------------

  /** Authenticates an `Authorization` header value. Constant-time on the secret; cached after the first load. */
  async authenticate(authorization: string | undefined): Promise<Authentication> {
    const token = bearerToken(authorization);
    if (token === null) return denied('missing API key: send Authorization: Bearer <key>');
    const parsed = token === '' ? null : parseKey(token);
    if (!parsed) return denied('malformed API key: expected Authorization: Bearer svc_<prefix>_<secret>');
    const state = await this.#load(parsed.prefix, false);
    if (state.status === 'none') return denied('invalid API key');
    if (!secretMatches(parsed.secret, state.secretSha256)) return denied('invalid API key', parsed.prefix);
    if (state.status === 'paused') return denied(`API key ${parsed.prefix} is paused`, parsed.prefix);
    if (state.status === 'revoked') return denied(`API key ${parsed.prefix} is revoked`, parsed.prefix);
    return { ok: true, key: this.#view(state), prefix: parsed.prefix };
  }

  /**
   * The key's state as this process knows it now (cached; loaded once if not), for the metering
   * re-check at reservation time: status and budgets. Null for an unknown prefix.
   */
  async current(prefix: string): Promise<KeyView | null> {
    if (!prefixPattern.test(prefix)) return null;
    const state = await this.#load(prefix, false);
    return state.status === 'none' ? null : this.#view(state);
  }

  /** The key read fresh from its stream (what every process has stored): for admin reads after writes. */
  async get(prefix: string): Promise<KeyView | null> {
    if (!prefixPattern.test(prefix)) return null;
    const state = await this.#load(prefix, true);
    return state.status === 'none' ? null : this.#view(state);
  }

  // --- administration ---------------------------------------------------------------------------

  async issue(input: IssueKeyInput, metadata: KeyCommandMetadata = {}): Promise<IssuedKey> {
    const budgets = { ...unlimited, ...input.budgets };
    // A fresh 48-bit prefix collides with an existing key about never; if it does, mint another.
    for (let attempt = 0; ; attempt++) {
      const minted = mintKey();
      const command: KeyCommand = {
        type: 'IssueKey',
        keyId: minted.prefix,
        secretSha256: minted.secretSha256,
        email: input.email,
        userId: input.userId ?? input.email,
        budgets,
        now: this.#now().toISOString(),
      };
      const outcome = await this.#handler.handle(keyStream(minted.prefix), command, keyDecider, { metadata: { ...metadata, key_prefix: minted.prefix } });
      if (outcome.accepted) return { key: minted.key, view: this.#view(outcome.state) };
      if (outcome.rejection.rejected !== 'key_exists' || attempt >= 3) throw rejectionError(outcome.rejection.rejected, outcome.rejection.message, minted.prefix);
    }
  }

  pause(prefix: string, metadata?: KeyCommandMetadata): Promise<KeyView> {
    return this.#command(prefix, { type: 'PauseKey', now: this.#now().toISOString() }, metadata);
  }

  resume(prefix: string, metadata?: KeyCommandMetadata): Promise<KeyView> {
    return this.#command(prefix, { type: 'ResumeKey', now: this.#now().toISOString() }, metadata);
  }

  revoke(prefix: string, metadata?: KeyCommandMetadata): Promise<KeyView> {
    return this.#command(prefix, { type: 'RevokeKey', now: this.#now().toISOString() }, metadata);
  }

  changeBudgets(prefix: string, budgets: Partial<KeyBudgetValues>, metadata?: KeyCommandMetadata): Promise<KeyView> {
    return this.#command(prefix, { type: 'ChangeBudgets', budgets, now: this.#now().toISOString() }, metadata);
  }

  async #command(prefix: string, command: KeyCommand, metadata: KeyCommandMetadata = {}): Promise<KeyView> {
    if (!prefixPattern.test(prefix)) throw notFound(prefix);
    // Decide on what the store holds now, not on a cache the subscription has not refreshed yet;
    // a write racing in from another process after this read is caught by the expected version.
    await this.#load(prefix, true);
    const outcome = await this.#handler.handle(keyStream(prefix), command, keyDecider, { metadata: { ...metadata, key_prefix: prefix } });
    if (!outcome.accepted) throw rejectionError(outcome.rejection.rejected, outcome.rejection.message, prefix);
    return this.#view(outcome.state);
  }

  // --- cache ------------------------------------------------------------------------------------

  #changed(streamId: string): void {
    this.#epochs.set(streamId, (this.#epochs.get(streamId) ?? 0) + 1);
    this.#handler.forget(streamId);
  }

  async #load(prefix: string, fresh: boolean): Promise<KeyState> {
    const stream = keyStream(prefix);
    for (;;) {
      const epoch = this.#epochs.get(stream);
      const { state } = await this.#handler.load(stream, keyDecider, { fresh });
      // A change seen while the stream was loading may not be in what was read: read again.
      if (this.#epochs.get(stream) !== epoch) {
        this.#handler.forget(stream);
        continue;
      }
      // Unknown prefixes are not kept: random tokens must not crowd real keys out of the cache.
      if (state.status === 'none') this.#handler.forget(stream);
      return state;
    }
  }

  #view(state: KeyState): KeyView {
    if (state.status === 'none') throw new Error('no key');
    let view = this.#views.get(state);
    if (!view) {
      view = Object.freeze({ prefix: state.keyId, keyId: state.keyId, email: state.email, userId: state.userId, status: state.status, budgets: state.budgets, issuedAt: state.issuedAt });
      this.#views.set(state, view);
    }
    return view;
  }
}

function denied(message: string, prefix?: string): Authentication {
  return { ok: false, error: apiError('invalid_api_key', message), ...(prefix ? { prefix } : {}) };
}

function notFound(prefix: string): ApiError {
  return apiError('not_found', `no API key with prefix ${JSON.stringify(prefix)}`);
}

function rejectionError(code: string, message: string, prefix: string): ApiError {
  switch (code) {
    case 'key_not_found':
      return notFound(prefix);
    case 'key_revoked':
      return apiError('key_revoked', message);
    default:
      return apiError('internal_error', message);
  }
}
