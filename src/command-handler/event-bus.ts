/**
 * The events other processes append, as this process hears them: one subscription to the global log
 * from its head, this process's own events passed over in the store. Each one first makes the cache
 * forget its stream, then goes to every listener (the services that keep something in memory).
 */
import type { EventLog, RecordedEvent, Subscription } from '../store/index.ts';
import { originKey } from './types.ts';

export type ForeignEventListener = (event: RecordedEvent) => void;

export class ForeignEventBus {
  readonly #store: EventLog;
  readonly #origin: string;
  readonly #forget: (streamId: string) => void;
  readonly #listeners = new Set<ForeignEventListener>();
  #following: Promise<Subscription> | null = null;

  /** `origin` names this process's own events; `forget` drops a stream another process wrote from the cache. */
  constructor(store: EventLog, origin: string, forget: (streamId: string) => void) {
    this.#store = store;
    this.#origin = origin;
    this.#forget = forget;
  }

  /** Starts the subscription once, whoever asks (the first caller's `onError` hears its failed reads). */
  follow(onError?: (error: unknown) => void): Promise<Subscription> {
    return (this.#following ??= this.#store.head().then((after) =>
      this.#store.subscribe({
        after,
        // This process's own events are passed over in the store, unread: its cache has them already.
        skipMetadata: { key: originKey, value: this.#origin },
        handle: async (events) => {
          for (const event of events) {
            this.#forget(event.streamId);
            for (const listener of this.#listeners) listener(event);
          }
        },
        onError,
      }),
    ));
  }

  /** Adds a listener; returns its removal. */
  listen(listener: ForeignEventListener): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }
}
