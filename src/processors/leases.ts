/**
 * Which process works on each processor (projection, workflow): a lease per processor in the SQL
 * database. A runner claims the leases of its processors at start and then every third of the lease's
 * length: one statement renews those it holds and takes those that expired (a holder that died, or one
 * that let them go as it stopped). It works only on what it holds; the others it neither reads the log
 * for nor writes. Its writes carry a fence (its holder name and each lease's epoch), checked with the
 * checkpoints locked, so a holder paused past its lease and overtaken writes nothing.
 *
 * An embedded store serves one process, which simply holds every lease: no lease rows, no claims.
 */
import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Queryable, SqlDatabase } from '../store/index.ts';
import { LeaseLost, type LeaseStore } from './lease-store.ts';

export interface LeaseSettings {
  /**
   * Whether runners of these processors take leases (default: yes, unless the database is the embedded
   * store, which one process holds). Without leases every runner works, and the checkpoint's row lock
   * alone keeps two from applying one batch.
   */
  leases?: boolean;
  /** A lease lasts this long unless renewed (default 3,000 ms); claims run every third of it. */
  leaseMs?: number;
  /** This runner's name in the lease table (default `host:pid:random`, unique per runner). */
  leaseHolder?: string;
}

/** The default lease: a dead holder's processors are taken over within about 1⅓ of it. */
export const defaultLeaseMs = 3000;

interface Held {
  epoch: number;
  /** performance.now() by which the lease has surely expired unless renewed: the claim that took or renewed it began then, minus the lease. */
  deadline: number;
}

export class ProcessorLeases {
  readonly holder: string;
  /** False on the embedded store (or when turned off): every lease is held, nothing is claimed. */
  readonly enabled: boolean;
  readonly #ttlMs: number;
  readonly #db: SqlDatabase;
  readonly #store: LeaseStore;
  readonly #names: readonly string[];
  readonly #onChange: () => void;
  readonly #onError: (error: unknown) => void;
  readonly #held = new Map<string, Held>();
  #stopping: AbortController | null = null;
  #loop: Promise<void> | null = null;
  #watchdog: NodeJS.Timeout | null = null;

  constructor(options: {
    db: SqlDatabase;
    store: LeaseStore;
    names: readonly string[];
    settings: LeaseSettings;
    /** Told when the leases held (or their epochs) changed after start: the owner starts or stops work to match. */
    onChange(): void;
    onError(error: unknown): void;
  }) {
    const embedded = (options.db as { adapter?: string }).adapter === 'pglite';
    this.enabled = options.settings.leases ?? !embedded;
    this.#ttlMs = options.settings.leaseMs ?? defaultLeaseMs;
    this.holder = options.settings.leaseHolder ?? `${hostname()}:${process.pid}:${randomBytes(3).toString('hex')}`;
    this.#db = options.db;
    this.#store = options.store;
    this.#names = [...options.names].sort();
    this.#onChange = options.onChange;
    this.#onError = options.onError;
  }

  /** Creates the lease rows, makes the first claim (awaited, not reported through onChange), then claims every third of the lease. */
  async start(): Promise<void> {
    await this.#store.ensure(this.#db, this.#names);
    if (!this.enabled || this.#stopping) return;
    this.#stopping = new AbortController();
    await this.#claim();
    const signal = this.#stopping.signal;
    const every = this.#ttlMs / 3;
    this.#loop = (async () => {
      while (!signal.aborted) {
        await sleep(every, undefined, { signal }).catch(() => {});
        if (!signal.aborted && (await this.#claim())) this.#onChange();
      }
    })();
    // A claim stuck on an unanswering database must not keep a lease alive here past its deadline.
    this.#watchdog = setInterval(() => this.#expired() && this.#onChange(), Math.max(10, this.#ttlMs / 6));
    this.#watchdog.unref();
  }

  /** Whether this runner holds the processor's lease now (as far as it can tell without asking: its deadline has not passed). */
  holds(name: string): boolean {
    if (!this.enabled) return true;
    const held = this.#held.get(name);
    return held !== undefined && held.deadline > performance.now();
  }

  /** Throws `LeaseLost` unless this runner holds all these leases as far as it knows, without asking the database. */
  expectHeld(names: readonly string[]): void {
    const lost = names.filter((name) => !this.holds(name));
    if (lost.length > 0) throw new LeaseLost(lost);
  }

  /**
   * The fence, in the transaction that writes for these processors: throws `LeaseLost` unless this
   * runner still holds each lease at the epoch it took, and keeps them from being taken until `tx` ends.
   */
  async fence(tx: Queryable, names: readonly string[]): Promise<void> {
    if (!this.enabled) return;
    this.expectHeld(names);
    await this.#store.fence(tx, names, { holder: this.holder, epochs: new Map(names.map((name) => [name, this.#held.get(name)!.epoch])) });
  }

  /** A write found these leases gone: work on them stops now (a later claim may take them again). */
  lost(names: readonly string[]): void {
    if (!this.enabled) return;
    let changed = false;
    for (const name of names) changed = this.#held.delete(name) || changed;
    if (changed) this.#onChange();
  }

  /** Stops claiming and lets every lease held go, so another process takes them over at its next claim. */
  async stop(): Promise<void> {
    if (!this.#stopping) return;
    this.#stopping.abort();
    if (this.#watchdog) clearInterval(this.#watchdog);
    await this.#loop;
    const held = [...this.#held.keys()];
    this.#held.clear();
    this.#stopping = null;
    this.#loop = null;
    if (held.length > 0) await this.#store.release(this.#db, held, this.holder).catch((error) => this.#onError(error));
  }

  /** One claim; resolves with whether what is held changed (a failed claim changes nothing until the deadlines pass). */
  async #claim(): Promise<boolean> {
    const asked = performance.now();
    let epochs: Map<string, number>;
    try {
      epochs = await this.#store.claim(this.#db, this.#names, this.holder, this.#ttlMs);
    } catch (error) {
      this.#onError(error);
      return this.#expired();
    }
    if (this.#stopping?.signal.aborted) {
      // Stopped while claiming: what this claim took is let go with the rest.
      for (const [name, epoch] of epochs) this.#held.set(name, { epoch, deadline: asked + this.#ttlMs });
      return false;
    }
    let changed = false;
    for (const name of this.#held.keys()) {
      if (!epochs.has(name)) changed = this.#held.delete(name) || changed;
    }
    for (const [name, epoch] of epochs) {
      changed = changed || this.#held.get(name)?.epoch !== epoch;
      this.#held.set(name, { epoch, deadline: asked + this.#ttlMs });
    }
    return changed;
  }

  /** Drops leases whose deadline passed without a renewal; whether any was. */
  #expired(): boolean {
    const now = performance.now();
    let changed = false;
    for (const [name, held] of this.#held) {
      if (held.deadline <= now) changed = this.#held.delete(name) || changed;
    }
    return changed;
  }
}
