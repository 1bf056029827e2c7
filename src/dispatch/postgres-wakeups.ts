/**
 * How the PostgreSQL transport's idle consumers hear of a publish: a bell per database in this
 * process, and one LISTEN connection per transport for other processes' publishes (NOTIFY).
 */
import { createHash } from 'node:crypto';
import pg from 'pg';
import type { SqlDatabase } from '../store/index.ts';

export const listenDefaults = {
  /** A lost LISTEN connection is opened again after this long; its health is checked this often. */
  listenRetryMs: 1_000,
  listenCheckMs: 10_000,
} as const;

/** Process-wide wake-ups per database: transports over the same `SqlDatabase` in this process ring each other's consumers. */
export const bells = new WeakMap<SqlDatabase, Bell>();

/** Tells waiting consumers of a kind that a message may be there (null: of any kind). */
export class Bell {
  readonly #waiters = new Set<{ kind: string; ring(): void }>();
  ring(kind: string | null): void {
    for (const waiter of this.#waiters) if (kind === null || waiter.kind === kind) waiter.ring();
  }
  on(kind: string, ring: () => void): () => void {
    const waiter = { kind, ring };
    this.#waiters.add(waiter);
    return () => this.#waiters.delete(waiter);
  }
}

/** A consumer's wake-up: `wait` resolves on a ring after `seen`, or after `ms`. */
export class Waker {
  generation = 0;
  #wake: (() => void) | null = null;
  ring(): void {
    this.generation += 1;
    this.#wake?.();
  }
  wait(seen: number, ms: number): Promise<void> {
    if (this.generation !== seen) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(done, ms);
      const self = this;
      function done() {
        clearTimeout(timer);
        self.#wake = null;
        resolve();
      }
      this.#wake = done;
    });
  }
}

/** A NOTIFY channel of this store's schema: an identifier under 64 bytes whatever the schema's name. */
export function channelOf(db: SqlDatabase): string {
  return `svc_dispatch_${createHash('sha256').update(db.internalSchema).digest('hex').slice(0, 16)}`;
}

/**
 * One LISTEN connection: each notification names the kind published. A lost connection is opened
 * again (and every consumer woken, for what was published meanwhile); a silent one is found by a
 * periodic `SELECT 1`. Consumers poll besides, so a lost notification only delays them.
 */
export async function listenForPublishes(url: string, channel: string, heard: (kind: string | null) => void, reportError: (error: unknown) => void): Promise<{ close(): Promise<void> }> {
  let client: pg.Client | null = null;
  let closed = false;
  let retry: NodeJS.Timeout | undefined;
  let check: NodeJS.Timeout | undefined;

  async function connect(): Promise<void> {
    const next = new pg.Client({ connectionString: url, application_name: 'svc dispatch listen', connectionTimeoutMillis: 5_000, keepAlive: true, query_timeout: listenDefaults.listenCheckMs });
    next.on('notification', (n) => n.channel === channel && heard(n.payload ?? null));
    const lost = (error?: unknown) => {
      if (client !== next) return;
      client = null;
      clearInterval(check);
      if (error) reportError(error);
      next.end().catch(() => {});
      if (!closed) retry = setTimeout(() => connect().catch((e) => lostBeforeListening(e)), listenDefaults.listenRetryMs);
    };
    const lostBeforeListening = (error: unknown) => {
      reportError(error);
      if (!closed) retry = setTimeout(() => connect().catch(lostBeforeListening), listenDefaults.listenRetryMs);
    };
    next.on('error', lost);
    next.on('end', () => lost());
    try {
      await next.connect();
      await next.query(`LISTEN "${channel}"`);
    } catch (error) {
      next.end().catch(() => {});
      throw error;
    }
    if (closed) {
      await next.end().catch(() => {});
      return;
    }
    client = next;
    let checking = false;
    check = setInterval(() => {
      if (checking) return lost(new Error('the dispatch LISTEN connection stopped answering'));
      checking = true;
      next.query('SELECT 1').then(() => (checking = false), lost);
    }, listenDefaults.listenCheckMs);
    check.unref();
    heard(null); // whatever was published while not listening
  }

  await connect();
  return {
    async close() {
      closed = true;
      clearTimeout(retry);
      clearInterval(check);
      const last = client;
      client = null;
      await last?.end().catch(() => {});
    },
  };
}
