/**
 * Each stream's state in memory: loaded from the store on first use, caught up when another process
 * may have written it, and the least recently loaded idle streams dropped beyond the cache size.
 */
import type { EventLog } from '../store/index.ts';
import type { Decider, DomainEvent, Rejection } from '../event-sourcing/index.ts';
import { commandIdKey } from './types.ts';
import { idle, type Entry, type Slot } from './slot.ts';
import type { ResendIds } from './resend-ids.ts';

type AnyDecider = Decider<unknown, unknown, DomainEvent, Rejection>;

export interface StreamCacheOptions {
  store: EventLog;
  /** Remembers the command ids of the events read. */
  resendIds: ResendIds;
  /** Streams kept in memory (0 keeps only streams with work under way). */
  cacheSize: number;
  /** Events per read when loading a stream. */
  readPageSize: number;
}

export class StreamCache {
  readonly #store: EventLog;
  readonly #resendIds: ResendIds;
  readonly #cacheSize: number;
  readonly #pageSize: number;
  readonly #slots = new Map<string, Slot>();
  readonly #loading = new Map<string, Promise<Slot>>();

  constructor(options: StreamCacheOptions) {
    this.#store = options.store;
    this.#resendIds = options.resendIds;
    this.#cacheSize = options.cacheSize;
    this.#pageSize = options.readPageSize;
  }

  /**
   * Calls `use` with the stream's slot, loaded or caught up first as needed (`fresh`: read what others
   * appended first), in the same turn as the checks: never while a catch-up (which replaces the slot's
   * state) is under way, as it could be by the time a caller resumed from an awaited slot.
   */
  async ready<T>(streamId: string, decider: AnyDecider, fresh: boolean, use: (slot: Slot) => T): Promise<T> {
    for (let read = false; ; ) {
      const slot = this.#slots.get(streamId);
      if (slot && slot.decider !== decider) throw new Error(`stream ${streamId} is already handled with another decider`);
      if (slot) {
        if (slot.catchingUp) {
          await slot.catchingUp.catch(() => {});
          continue;
        }
        if (((fresh && !read) || slot.stale) && idle(slot)) {
          slot.stale = false;
          read = true;
          slot.catchingUp = this.catchUp(slot).finally(() => {
            slot.latest = { ...slot.confirmed };
            slot.catchingUp = null;
          });
          continue;
        }
        return use(slot);
      }
      let loading = this.#loading.get(streamId);
      if (!loading) {
        loading = this.#loadSlot(streamId, decider).finally(() => this.#loading.delete(streamId));
        this.#loading.set(streamId, loading);
      }
      await loading;
      read = true;
    }
  }

  /** Another process may have written the stream: the next decision reads what it missed first. */
  forget(streamId: string): void {
    const slot = this.#slots.get(streamId);
    if (!slot) return;
    if (idle(slot)) this.#slots.delete(streamId);
    else slot.stale = true;
  }

  /** What the store holds of the stream is unknown now: the next command reloads it. */
  drop(streamId: string): void {
    this.#slots.delete(streamId);
  }

  /** Drops the least recently loaded idle streams beyond the cache size. */
  trim(): void {
    if (this.#slots.size <= this.#cacheSize) return;
    for (const [id, slot] of this.#slots) {
      if (this.#slots.size <= this.#cacheSize) break;
      if (idle(slot)) this.#slots.delete(id);
    }
  }

  /** Folds the events stored after the slot's confirmed version into it, each checked by the decider's catalogue. */
  async catchUp(slot: Slot): Promise<void> {
    let { state, version } = slot.confirmed;
    for (;;) {
      const page = await this.#store.readStream(slot.streamId, { fromVersion: version + 1, limit: this.#pageSize });
      for (const recorded of page.events) {
        const event = slot.decider.events.parse(recorded);
        state = slot.decider.evolve(state, event);
        const commandId = recorded.metadata?.[commandIdKey];
        if (typeof commandId === 'string') this.#resendIds.rememberStored(slot, commandId, event, recorded.streamVersion);
        version = recorded.streamVersion;
      }
      if (page.events.length < this.#pageSize) {
        version = Math.max(version, page.version);
        break;
      }
    }
    slot.confirmed = { state, version };
  }

  /**
   * After a `DuplicateEventId`: a command whose events the store holds already, though this process
   * no longer remembers it (a resend of a command decided long ago). Its events are looked up in its
   * stream and remembered, so that it resolves as resent (`redecide`) instead of being decided again.
   */
  async recall(slot: Slot, entries: readonly Entry[]): Promise<void> {
    const missing = new Set(entries.filter((entry) => !slot.recent.has(entry.commandId)).map((entry) => entry.commandId));
    if (missing.size === 0) return;
    for (let from = 1; from <= slot.confirmed.version; from += this.#pageSize) {
      const page = await this.#store.readStream(slot.streamId, { fromVersion: from, limit: this.#pageSize });
      for (const recorded of page.events) {
        const commandId = recorded.metadata?.[commandIdKey];
        if (typeof commandId === 'string' && missing.has(commandId)) this.#resendIds.rememberStored(slot, commandId, slot.decider.events.parse(recorded), recorded.streamVersion);
      }
      if (page.events.length < this.#pageSize) break;
    }
  }

  async #loadSlot(streamId: string, decider: AnyDecider): Promise<Slot> {
    const initial = { state: decider.initialState(), version: 0 };
    const slot: Slot = { streamId, decider, confirmed: initial, latest: initial, recent: new Map(), inflight: null, pending: [], catchingUp: null, stale: false, lingering: null, conflicts: 0 };
    await this.catchUp(slot);
    slot.latest = { ...slot.confirmed };
    this.trim(); // make room first: the new slot stays at least until its first decision
    this.#slots.set(streamId, slot);
    return slot;
  }
}
