/**
 * The Kafka transport (`kafkajs`): a topic per kind, the key (a job id) as the message key, an
 * idempotent producer, a consumer group per kind. What a message's state is (acknowledged, its
 * deliveries) lives in Kafka itself, in the group's committed offset and that commit's metadata, so
 * no other store is needed: see README.md ("Kafka") for the mapping of each semantic. This file is the
 * transport and its publisher; the consumer is kafka-consumer.ts, its partitions kafka-partitions.ts,
 * a partition's ledger kafka-ledger.ts, the assigner kafka-assignment.ts, names and admin calls
 * kafka-admin.ts, the options kafka-options.ts.
 */
import { Kafka, Partitioners, logLevel, type Admin, type Producer } from 'kafkajs';
import { TransportLifecycle, kindKey } from './consumer-stop.ts';
import { adminRead, groupFor, topicCreator, topicFor } from './kafka-admin.ts';
import { kafkaConsumer } from './kafka-consumer.ts';
import { acknowledgedIn } from './kafka-ledger.ts';
import { kafkaDispatchDefaults, seqHeader, type KafkaDispatchOptions } from './kafka-options.ts';
import { DispatchClosed, dispatchDefaults, type DispatchMessage, type DispatchTransport } from './types.ts';

export { kafkaDispatchDefaults, type KafkaDispatchOptions } from './kafka-options.ts';
export { groupFor, topicFor } from './kafka-admin.ts';
export { PartitionLedger, acknowledgedIn, decodeLedgerMetadata } from './kafka-ledger.ts';
export { busyStickyAssigner, decodeBusy, encodeBusy, kafkaAssignerName, planAssignment, type AssignmentMember } from './kafka-assignment.ts';
export { Committer } from './kafka-partitions.ts';

/** The transport, with a way to wait for (or fail fast on) its connections. */
export interface KafkaDispatchTransport extends DispatchTransport {
  /** Resolves once the admin client and the producer are connected; publishing and consuming wait for it by themselves. */
  ready(): Promise<void>;
}

interface Sent {
  partition: number;
  offset: bigint;
}

/** The transport over a Kafka cluster. Close it after the workers that consume it. */
export function kafkaTransport(options: KafkaDispatchOptions): KafkaDispatchTransport {
  if (!Array.isArray(options.brokers) || options.brokers.length === 0 || options.brokers.some((b) => !/^\S+:\d+$/.test(b))) {
    throw new RangeError(`dispatch over Kafka needs brokers as host:port, got ${JSON.stringify(options.brokers)}`);
  }
  const topicPrefix = options.topicPrefix ?? kafkaDispatchDefaults.topicPrefix;
  const groupPrefix = options.groupPrefix ?? kafkaDispatchDefaults.groupPrefix;
  const partitions = options.partitions ?? kafkaDispatchDefaults.partitions;
  if (!Number.isSafeInteger(partitions) || partitions < 1) throw new RangeError(`dispatch Kafka partitions must be a whole number >= 1, got ${partitions}`);
  const maxHeld = options.maxHeldPerPartition ?? kafkaDispatchDefaults.maxHeldPerPartition;
  if (!Number.isSafeInteger(maxHeld) || maxHeld < 1 || maxHeld > 100) throw new RangeError(`dispatch Kafka maxHeldPerPartition must be 1 to 100, got ${maxHeld}`);
  const reportError = (error: unknown, message?: DispatchMessage) => options.onError?.(error, message);
  const lifecycle = new TransportLifecycle(options.stopGraceMs ?? dispatchDefaults.stopGraceMs);

  const kafka = new Kafka({
    clientId: options.clientId ?? kafkaDispatchDefaults.clientId,
    brokers: options.brokers,
    ssl: options.ssl,
    sasl: options.sasl,
    // silent: its log calls each routine rebalance an error; what matters is thrown to us or comes as a consumer's crash
    logLevel: logLevel.NOTHING,
  });
  const admin: Admin = kafka.admin();
  // idempotent: a send retried after a lost answer is written once; acks -1: durable on every in-sync replica
  const producer: Producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1, allowAutoTopicCreation: false, createPartitioner: Partitioners.DefaultPartitioner });

  let connected: Promise<void> | null = null;
  function ready(): Promise<void> {
    connected ??= Promise.all([admin.connect(), producer.connect()]).then(
      () => undefined,
      (error: unknown) => {
        connected = null;
        throw error;
      },
    );
    return connected;
  }

  const ensureTopic = topicCreator(admin, ready, { partitions, replicationFactor: options.replicationFactor });

  /** Where this process last sent each kind and key, oldest first: what `publish` checks against the group's commits. */
  const sent = new Map<string, Sent>();
  const publishing = new Map<string, Promise<unknown>>();
  let sequence = 0;

  /** Whether the message sent there is still waiting or in flight: not acknowledged by the group, and not removed by retention. */
  async function stillWaiting(kind: string, topic: string, last: Sent): Promise<boolean> {
    return adminRead(() => stillWaitingOnce(kind, topic, last));
  }

  async function stillWaitingOnce(kind: string, topic: string, last: Sent): Promise<boolean> {
    const [offsets] = await admin.fetchOffsets({ groupId: groupFor(groupPrefix, kind), topics: [topic] });
    const committed = offsets?.partitions.find((p) => p.partition === last.partition);
    if (committed && acknowledgedIn(committed.offset, committed.metadata, last.offset)) return false;
    const range = (await admin.fetchTopicOffsets(topic)).find((p) => p.partition === last.partition);
    if (range && BigInt(range.low) > last.offset) return false;
    return true;
  }

  async function publishOnce(kind: string, key: string, body: string): Promise<boolean> {
    const topic = topicFor(topicPrefix, kind);
    await ensureTopic(topic);
    const id = kindKey(kind, key);
    const last = sent.get(id);
    if (last && (await stillWaiting(kind, topic, last))) return false;
    if (lifecycle.closed) throw new DispatchClosed();
    const [record] = await producer.send({ topic, acks: -1, messages: [{ key, value: body, headers: { [seqHeader]: String(++sequence) } }] });
    sent.delete(id);
    sent.set(id, { partition: record.partition, offset: BigInt(record.baseOffset ?? record.offset ?? '0') });
    // forgetting an old key only means a later publish of it is sent again (a duplicate the handlers absorb)
    if (sent.size > kafkaDispatchDefaults.rememberedKeys) sent.delete(sent.keys().next().value!);
    return true;
  }

  return {
    ...lifecycle.transport('kafka', {
      async publish(kind, key, payload) {
        const body = JSON.stringify(payload);
        const id = kindKey(kind, key);
        // one publish of a kind and key at a time here, so two at once cannot both see nothing waiting
        const previous = publishing.get(id) ?? Promise.resolve();
        const attempt = previous.catch(() => {}).then(() => publishOnce(kind, key, body));
        publishing.set(id, attempt);
        try {
          return await attempt;
        } finally {
          if (publishing.get(id) === attempt) publishing.delete(id);
        }
      },

      consume: (kind, handler, consumeOptions) =>
        kafkaConsumer({ kafka, admin, options, lifecycle, topicPrefix, groupPrefix, maxHeld, ready, ensureTopic, reportError }, kind, handler, consumeOptions),

      async release() {
        await Promise.all([...publishing.values()].map((p) => p.catch(() => {})));
        await Promise.all([producer.disconnect(), admin.disconnect()]).catch((error: unknown) => reportError(error));
      },
    }),
    ready,
  };
}
