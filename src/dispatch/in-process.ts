/**
 * The in-process transport: queues in memory, handlers in this process. Nothing survives the process;
 * the jobs' own streams do, and their resumer dispatches again what a restart lost.
 */
import { TransportLifecycle, kindKey, type RunningDelivery } from './consumer-stop.ts';
import {
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

interface Consumer {
  readonly handler: DispatchHandler;
  readonly concurrency: number;
  readonly running: Set<RunningDelivery>;
  stopping: boolean;
}

export function inProcessTransport(options: InProcessDispatchOptions = {}): DispatchTransport {
  const lifecycle = new TransportLifecycle(options.stopGraceMs ?? dispatchDefaults.stopGraceMs);
  /** Every message waiting, backing off or in flight, by kind and key: what `publish` refuses to add twice. */
  const entries = new Map<string, Entry>();
  /** Per kind, the messages ready for a handler, oldest first. */
  const ready = new Map<string, Entry[]>();
  const consumers = new Map<string, Set<Consumer>>();
  const retryTimers = new Set<NodeJS.Timeout>();
  const pumpsDue = new Set<string>();
  let seq = 0;

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
    while (line && line.length > 0 && !lifecycle.closed) {
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
          entries.delete(kindKey(entry.kind, entry.key));
        },
        (error: unknown) => {
          options.onError?.(error, message);
          if (lifecycle.closed) return;
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
    const running: RunningDelivery = { controller, settled };
    consumer.running.add(running);
  }

  return lifecycle.transport('inprocess', {
    async publish(kind, key, payload) {
      const id = kindKey(kind, key);
      if (entries.has(id)) return false;
      const entry: Entry = { seq: ++seq, kind, key, payload: JSON.stringify(payload), deliveries: 0 };
      entries.set(id, entry);
      enqueue(entry);
      return true;
    },

    consume(kind: string, handler: DispatchHandler, consumeOptions?: ConsumeOptions): DispatchConsumer {
      const consumer: Consumer = { handler, concurrency: concurrencyOf(consumeOptions), running: new Set(), stopping: false };
      const kindConsumers = consumers.get(kind) ?? new Set();
      consumers.set(kind, kindConsumers);
      kindConsumers.add(consumer);
      schedulePump(kind);
      return lifecycle.consumer({
        halt() {
          consumer.stopping = true;
          kindConsumers.delete(consumer);
        },
        running: consumer.running,
      });
    },

    async release() {
      for (const timer of retryTimers) clearTimeout(timer);
      retryTimers.clear();
      entries.clear();
      ready.clear();
    },
  });
}
