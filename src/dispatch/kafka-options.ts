/** The Kafka transport's options and their defaults (kafka.ts). */
import type { SASLOptions } from 'kafkajs';
import type { DispatchTimingOptions } from './types.ts';

export interface KafkaDispatchOptions extends DispatchTimingOptions {
  /** `host:port` of one or more brokers (the rest are discovered). */
  brokers: string[];
  clientId?: string;
  ssl?: boolean;
  sasl?: SASLOptions;
  /** A kind's topic is this prefix and the kind (default `svc.dispatch.`); created if missing. */
  topicPrefix?: string;
  /** A kind's consumer group is this prefix and the kind (default `svc.dispatch.`). Every process of a deployment must use the same. */
  groupPrefix?: string;
  /** Partitions of a topic this transport creates (default 8): at most this many consumers of a kind get work at once. */
  partitions?: number;
  /** Replicas of a topic this transport creates (default: the brokers' `default.replication.factor`). */
  replicationFactor?: number;
  /** A consumer whose heartbeats stop this long is out of the group and its partitions go to the others (default 30,000 ms; the brokers allow 6,000 at least by default). */
  sessionTimeoutMs?: number;
  /** How often a consumer tells the group it lives (default 3,000 ms, at most a third of the session timeout). */
  heartbeatIntervalMs?: number;
  /** How long a rebalance waits for every member to rejoin (default 60,000 ms). */
  rebalanceTimeoutMs?: number;
  /** A fetch waits this long for messages before asking again; also how long a stop may wait for a fetch in flight (default 1,000 ms). */
  fetchWaitMs?: number;
  /** Unacknowledged messages a consumer holds per partition before it stops fetching that partition (default 64, at most 100: their state must fit a commit's metadata). */
  maxHeldPerPartition?: number;
}

export const kafkaDispatchDefaults = {
  clientId: 'svc-dispatch',
  topicPrefix: 'svc.dispatch.',
  groupPrefix: 'svc.dispatch.',
  partitions: 8,
  sessionTimeoutMs: 30_000,
  heartbeatIntervalMs: 3_000,
  rebalanceTimeoutMs: 60_000,
  fetchWaitMs: 1_000,
  maxHeldPerPartition: 64,
  /** A publisher remembers where it sent this many keys, to answer `false` for those still waiting. */
  rememberedKeys: 10_000,
  /** A consumer that could not start, or whose client gave up, is started again after this long. */
  restartMs: 2_000,
} as const;

/** The header that carries a publisher's sequence: with the record's timestamp, the order handlers start in. */
export const seqHeader = 'svc-seq';
