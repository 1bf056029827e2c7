/**
 * The in-process transport: queues in memory, handlers in this process. Nothing survives the process;
 * the jobs' own streams do, and their resumer dispatches again what a restart lost.
 */
import {
  DispatchClosed,
  DispatchStopping,
  concurrencyOf,
  dispatchDefaults,
  retryDelayMs,
  type ConsumeOptions,
  type DispatchConsumer,
  type DispatchHandler,
  type DispatchMessage,
  type DispatchTimingOptions,
  type DispatchTransport,
} from './types.ts';

export type InProcessDispatchOptions = DispatchTimingOptions;

interface Entry {
  readonly seq: number;
  readonly kind: string;
  readonly key: string;
  /** JSON text: each delivery parses its own copy, as a message read from a database would be. */
  readonly payload: string;
  deliveries: number;
}

interface Running {
  readonly controller: AbortController;
  readonly settled: Promise<void>;
}

interface Consumer {
  readonly kind: string;
  readonly handler: DispatchHandler;
  readonly concurrency: number;
  readonly running: Set<Running>;
  stopping: boolean;
}

const entryKey = (kind: string, key: string) => `${kind}\u0000${key}`;

export function inProcessTransport(options: InProcessDispatchOptions = {}): DispatchTransport {
  const graceMs = options.stopGraceMs ?? dispatchDefaults.stopGraceMs;
  /** Every message waiting, backing off or in flight, by kind and key: what `publish` refuses to add twice. */
  const entries = new Map<string, Entry>();
  /** Per kind, the messages ready for a handler, oldest first. */
  const ready = new Map<string, Entry[]>();
  const consumers = new Map<string, Set<Consumer>>();
  const consumerStops = new Set<Promise<void>>();
  const retryTimers = new Set<NodeJS.Timeout>();
  const pumpsDue = new Set<string>();
  let seq = 0;
  let closed = false;
  let closing: Promise<void> | null = null;

  /** Back in line at its first place: a redelivered message keeps its turn. */
  function enqueue(entry: Entry): void {
    let line = ready.get(entry.kind);
    if (!line) ready.set(entry.kind, (line = []));
    let at = line.length;
    while (at > 0 && line[at - 1].seq > entry.seq) at -= 1;
    line.splice(at, 0, entry);
    schedulePump(entry.kind);
  }

  /** Hands messages out after the caller's turn, never inside `publish` or a handler's settlement. */
  function schedulePump(kind: string): void {
    if (pumpsDue.has(kind)) return;
    pumpsDue.add(kind);
    queueMicrotask(() => {
      pumpsDue.delete(kind);
      pump(kind);
    });
  }

  function pump(kind: string): void {
    const line = ready.get(kind);
    while (line && line.length > 0 && !closed) {
      // the least busy consumer of the kind, so several consumers share the work
      let chosen: Consumer | null = null;
      for (const consumer of consumers.get(kind) ?? []) {
        if (consumer.stopping || consumer.running.size >= consumer.concurrency) continue;
        if (!chosen || consumer.running.size < chosen.running.size) chosen = consumer;
      }
      if (!chosen) return;
      deliver(chosen, line.shift()!);
    }
  }

  function deliver(consumer: Consumer, entry: Entry): void {
    entry.deliveries += 1;
    const message: DispatchMessage = Object.freeze({
      id: `inprocess-${entry.seq}`,
      kind: entry.kind,
      key: entry.key,
      payload: JSON.parse(entry.payload) as Record<string, unknown>,
      deliveries: entry.deliveries,
    });
    const controller = new AbortController();
    const settled = Promise.resolve()
      .then(() => consumer.handler(message, controller.signal))
      .then(
        () => {
          entries.delete(entryKey(entry.kind, entry.key));
        },
        (error: unknown) => {
          options.onError?.(error, message);
          if (closed) return;
          // stopped mid-way: another consumer may take it at once; otherwise retry after the backoff
          if (controller.signal.aborted) return enqueue(entry);
          const timer = setTimeout(() => {
            retryTimers.delete(timer);
            enqueue(entry);
          }, retryDelayMs(entry.deliveries, options));
          retryTimers.add(timer);
        },
      )
      .finally(() => {
        consumer.running.delete(running);
        schedulePump(entry.kind);
      });
    const running: Running = { controller, settled };
    consumer.running.add(running);
  }

  async function stopConsumer(consumer: Consumer): Promise<void> {
    consumer.stopping = true;
    consumers.get(consumer.kind)?.delete(consumer);
    if (consumer.running.size === 0) return;
    const grace = setTimeout(() => {
      for (const running of consumer.running) running.controller.abort(new DispatchStopping(graceMs));
    }, graceMs);
    try {
      while (consumer.running.size > 0) await Promise.all([...consumer.running].map((r) => r.settled));
    } finally {
      clearTimeout(grace);
    }
  }

  return {
    name: 'inprocess',

    async publish(kind, key, payload) {
      if (closed) throw new DispatchClosed();
      const id = entryKey(kind, key);
      if (entries.has(id)) return false;
      const entry: Entry = { seq: ++seq, kind, key, payload: JSON.stringify(payload), deliveries: 0 };
      entries.set(id, entry);
      enqueue(entry);
      return true;
    },

    consume(kind: string, handler: DispatchHandler, consumeOptions?: ConsumeOptions): DispatchConsumer {
      if (closed) throw new DispatchClosed();
      const consumer: Consumer = { kind, handler, concurrency: concurrencyOf(consumeOptions), running: new Set(), stopping: false };
      let kindConsumers = consumers.get(kind);
      if (!kindConsumers) consumers.set(kind, (kindConsumers = new Set()));
      kindConsumers.add(consumer);
      schedulePump(kind);
      let stopped: Promise<void> | null = null;
      return {
        stop() {
          if (!stopped) {
            const stopping = stopConsumer(consumer);
            consumerStops.add(stopping);
            stopped = stopping.finally(() => consumerStops.delete(stopping));
          }
          return stopped;
        },
      };
    },

    close() {
      closing ??= (async () => {
        const all = [...consumers.values()].flatMap((set) => [...set]);
        const stops = [...consumerStops, ...all.map(stopConsumer)];
        closed = true;
        await Promise.all(stops);
        for (const timer of retryTimers) clearTimeout(timer);
        retryTimers.clear();
        entries.clear();
        ready.clear();
      })();
      return closing;
    },
  };
}
