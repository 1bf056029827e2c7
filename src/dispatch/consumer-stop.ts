/**
 * What every transport does alike: a consumer's stop (take no more messages, wait for the handlers
 * running, abort them with `DispatchStopping` after the grace, release what it holds) and the
 * transport's face (publishing and consuming refused once closed; `close` stops every consumer, then
 * releases what the transport holds). Each transport gives its own parts.
 */
import { DispatchClosed, DispatchStopping, type ConsumeOptions, type DispatchConsumer, type DispatchHandler, type DispatchTransport } from './types.ts';

/** A delivery whose handler runs: its signal, and its end (once the handler and the transport's bookkeeping are done). */
export interface RunningDelivery {
  readonly controller: AbortController;
  readonly settled?: Promise<void>;
}

/** A consumer's parts of its stop, in the order `stop` uses them. */
export interface ConsumerStopParts {
  /** Takes no more messages; called at once, synchronously, when `stop` is. */
  halt(): void;
  /** Resolves once no delivery can begin any more (a claim in flight ended and its messages were handed back). */
  halted?: Promise<void>;
  /** The deliveries running: aborted after the grace, and waited for until none is left. */
  readonly running: ReadonlySet<RunningDelivery>;
  /** After every handler settled (even when waiting failed): timers, commits, a connection. */
  release?(): void | Promise<void>;
}

/** The consumer side of one transport: its consumers, their stops, its closing. */
export class TransportLifecycle {
  readonly #graceMs: number;
  readonly #consumers = new Set<DispatchConsumer>();
  #closed = false;
  #closing: Promise<void> | null = null;

  constructor(graceMs: number) {
    this.#graceMs = graceMs;
  }

  /** From the moment `close` is called. */
  get closed(): boolean {
    return this.#closed;
  }

  /** A consumer whose `stop` runs its parts once (a second call gets the same promise), and that `close` stops. */
  consumer(parts: ConsumerStopParts): DispatchConsumer {
    let stopped: Promise<void> | null = null;
    const consumer: DispatchConsumer = {
      stop: () => (stopped ??= this.#stop(consumer, parts)),
    };
    this.#consumers.add(consumer);
    return consumer;
  }

  async #stop(consumer: DispatchConsumer, parts: ConsumerStopParts): Promise<void> {
    parts.halt();
    const graceMs = this.#graceMs;
    const grace = setTimeout(() => {
      for (const delivery of parts.running) delivery.controller.abort(new DispatchStopping(graceMs));
    }, graceMs);
    try {
      await parts.halted;
      while (parts.running.size > 0) await Promise.all([...parts.running].map((d) => d.settled));
    } finally {
      clearTimeout(grace);
      try {
        await parts.release?.();
      } finally {
        this.#consumers.delete(consumer);
      }
    }
  }

  /**
   * The transport's face over its own `publish` and `consume`: both refused with `DispatchClosed` once
   * closed; `close` (once) refuses from its call on, stops every consumer, then runs `release`.
   */
  transport(
    name: string,
    parts: {
      publish: DispatchTransport['publish'];
      consume(kind: string, handler: DispatchHandler, options?: ConsumeOptions): DispatchConsumer;
      release?(): Promise<void>;
    },
  ): DispatchTransport {
    return {
      name,
      publish: async (kind, key, payload) => {
        if (this.#closed) throw new DispatchClosed();
        return parts.publish(kind, key, payload);
      },
      consume: (kind, handler, options) => {
        if (this.#closed) throw new DispatchClosed();
        return parts.consume(kind, handler, options);
      },
      close: () =>
        (this.#closing ??= (async () => {
          this.#closed = true;
          await Promise.all([...this.#consumers].map((c) => c.stop()));
          await parts.release?.();
        })()),
    };
  }
}

/** A message's identity in a transport's memory: its kind and key. */
export const kindKey = (kind: string, key: string): string => `${kind}\u0000${key}`;
