/**
 * Failed authentications per client address: after `limit` failures (a missing, malformed, unknown or
 * wrong API key or admin token) within `windowMs` of the first, the address is refused 429
 * `rate_limited` (with `Retry-After`, until the window ends) before its credentials are looked at, so
 * guessing a token online costs a window per `limit` guesses. A client that authenticates correctly
 * never counts a failure, so it is never refused by this; one behind the same address as a guesser
 * is (see SVC_TRUSTED_PROXIES for a balancer in front). In memory, per process.
 */
import { apiError, type ApiError } from '../errors/index.ts';

export interface AuthFailureLimits {
  /** Failures per window before an address is refused; 0: no limit. */
  limit: number;
  windowMs: number;
}

interface Client {
  failures: number;
  since: number;
}

/** Addresses tracked at most; past it the oldest window is forgotten first. */
const MAX_CLIENTS = 100_000;

export class AuthFailureLimiter {
  readonly #clients = new Map<string, Client>();

  constructor(readonly limits: AuthFailureLimits) {}

  /** The refusal for `address` now (429, Retry-After), or null when it may authenticate. */
  refusal(address: string, now = Date.now()): ApiError | null {
    if (this.limits.limit === 0) return null;
    const client = this.#clients.get(address);
    if (!client) return null;
    const left = client.since + this.limits.windowMs - now;
    if (left <= 0) {
      this.#clients.delete(address);
      return null;
    }
    if (client.failures < this.limits.limit) return null;
    const seconds = Math.max(1, Math.ceil(left / 1000));
    return apiError('rate_limited', `too many failed authentications from this address (${client.failures} within ${Math.round(this.limits.windowMs / 1000)} s); try again in ${seconds} s`, {
      retryAfter: seconds,
    });
  }

  /** Counts a failed authentication of `address`. */
  failed(address: string, now = Date.now()): void {
    if (this.limits.limit === 0) return;
    let client = this.#clients.get(address);
    if (!client || now - client.since >= this.limits.windowMs) {
      this.#clients.delete(address);
      if (this.#clients.size >= MAX_CLIENTS) this.#clients.delete(this.#clients.keys().next().value!);
      client = { failures: 0, since: now };
      this.#clients.set(address, client);
    }
    client.failures++;
  }
}
