/**
 * The work dispatch port: messages of a kind (a job type), keyed by a job id, handed to consumers at
 * least once. Narrow on purpose so that a Kafka transport (topic per kind, key = job id, a consumer
 * group per kind) fits the same contract as the in-process and PostgreSQL ones (README.md).
 */

/** One delivery of a message. `deliveries` counts this one: 1 the first time, 2 after one redelivery. */
export interface DispatchMessage {
  readonly id: string;
  readonly kind: string;
  readonly key: string;
  readonly payload: Readonly<Record<string, unknown>>;
  readonly deliveries: number;
}

/**
 * Handles one message. Resolving acknowledges it (it is removed); throwing has it redelivered after a
 * backoff. `signal` aborts when the consumer stops and its grace has run out, or (PostgreSQL) when
 * the message's lease was lost to another consumer: stop then, and throw.
 */
export type DispatchHandler = (message: DispatchMessage, signal: AbortSignal) => Promise<void>;

export interface ConsumeOptions {
  /** Messages this consumer handles at once (default 1). */
  concurrency?: number;
}

export interface DispatchConsumer {
  /** Takes no more messages, waits for the handlers in flight (aborting their signal after the grace). */
  stop(): Promise<void>;
}

export interface DispatchTransport {
  /** 'inprocess' | 'postgres' */
  readonly name: string;
  /**
   * Queues a message once it is durable (PostgreSQL) or queued (in process). False, and nothing
   * added, while a message of this kind and key is waiting or in flight: a job is dispatched once at a time.
   */
  publish(kind: string, key: string, payload: Record<string, unknown>): Promise<boolean>;
  consume(kind: string, handler: DispatchHandler, options?: ConsumeOptions): DispatchConsumer;
  /** Stops every consumer (as `stop` does) and releases what the transport holds; the database stays open. */
  close(): Promise<void>;
}

/** Timing shared by the transports; each transport documents its own extras. */
export interface DispatchTimingOptions {
  /** First redelivery of a message whose handler threw, after this (ms); doubles per delivery (default 1,000). */
  retryBackoffMs?: number;
  /** Longest backoff (default 60,000 ms). */
  maxRetryBackoffMs?: number;
  /** `stop` waits this long for handlers in flight before aborting their signal (default 10,000 ms). */
  stopGraceMs?: number;
  /** Told of a handler that threw and of the transport's own failures (a query that failed); default: nothing. */
  onError?: (error: unknown, message?: DispatchMessage) => void;
}

export const dispatchDefaults = {
  retryBackoffMs: 1_000,
  maxRetryBackoffMs: 60_000,
  stopGraceMs: 10_000,
} as const;

/** The wait before redelivering a message whose `deliveries`-th delivery failed. */
export function retryDelayMs(deliveries: number, options: DispatchTimingOptions): number {
  const first = options.retryBackoffMs ?? dispatchDefaults.retryBackoffMs;
  const most = options.maxRetryBackoffMs ?? dispatchDefaults.maxRetryBackoffMs;
  return Math.min(most, first * 2 ** Math.min(30, Math.max(0, deliveries - 1)));
}

/** A positive whole number of messages at once, or RangeError. */
export function concurrencyOf(options: ConsumeOptions | undefined): number {
  const concurrency = options?.concurrency ?? 1;
  if (!Number.isSafeInteger(concurrency) || concurrency < 1) throw new RangeError(`dispatch concurrency must be a whole number >= 1, got ${concurrency}`);
  return concurrency;
}

/** The transport was closed: nothing more is published or consumed through it. */
export class DispatchClosed extends Error {
  override name = 'DispatchClosed';
  constructor() {
    super('the dispatch transport is closed');
  }
}

/** A handler's signal reason: its consumer stopped and the grace ran out. */
export class DispatchStopping extends Error {
  override name = 'DispatchStopping';
  constructor(graceMs: number) {
    super(`the dispatch consumer stopped and its handler was still running after ${graceMs} ms`);
  }
}

/** A handler's signal reason (PostgreSQL): the message was taken by another consumer or removed; its work is no longer this handler's. */
export class DispatchLeaseLost extends Error {
  override name = 'DispatchLeaseLost';
  constructor(readonly messageId: string) {
    super(`dispatch message ${messageId} is no longer leased to this consumer`);
  }
}
