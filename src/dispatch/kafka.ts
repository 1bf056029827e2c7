/**
 * The Kafka transport (`kafkajs`): a topic per kind, the key (a job id) as the message key, an
 * idempotent producer, a consumer group per kind. What a message's state is (acknowledged, its
 * deliveries) lives in Kafka itself, in the group's committed offset and that commit's metadata, so
 * no other store is needed: see README.md ("Kafka") for the mapping of each semantic.
 */
import { createHash } from 'node:crypto';
import { AssignerProtocol, Kafka, Partitioners, logLevel, type Admin, type Assigner, type Consumer, type EachBatchPayload, type KafkaMessage, type PartitionAssigner, type Producer, type SASLOptions } from 'kafkajs';
import { TransportLifecycle, kindKey } from './consumer-stop.ts';
import {
  DispatchClosed,
  DispatchLeaseLost,
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

/** The protocol name of the assigner: every member of a group must use it. */
export const kafkaAssignerName = 'SvcDispatchBusySticky';

// --- names ------------------------------------------------------------------------------------------

const legalTopic = /^[A-Za-z0-9._-]+$/;

/**
 * A kind's topic: the prefix and the kind, or, when the kind has characters Kafka does not allow in a
 * topic name or the name would pass its 249 characters, a legal rendering of it and a hash of the kind
 * (so two kinds never share a topic).
 */
export function topicFor(prefix: string, kind: string): string {
  if (kind === '') throw new RangeError('a dispatch kind must not be empty');
  const plain = `${prefix}${kind}`;
  if (legalTopic.test(plain) && plain.length <= 249) return plain;
  const hash = createHash('sha256').update(kind).digest('hex').slice(0, 16);
  const readable = kind.replace(/[^A-Za-z0-9._-]/g, '_').slice(0, Math.max(0, 249 - prefix.length - hash.length - 1));
  const name = `${prefix.replace(/[^A-Za-z0-9._-]/g, '_')}${readable}-${hash}`;
  if (name.length > 249) throw new RangeError(`dispatch topic prefix too long: ${prefix.length} characters`);
  return name;
}

/** A kind's consumer group (group ids may be any string). */
export const groupFor = (prefix: string, kind: string): string => `${prefix}${kind}`;

// --- a partition's state, kept in the group's committed offset and its metadata ----------------------

/**
 * What a consumer group knows of one partition: every offset below `base` (the committed offset) is
 * acknowledged; above it, the offsets in `acked` ranges are too (handlers finish out of order), and
 * `deliveries` counts the deliveries begun of those not acknowledged. The committed offset is `base`,
 * the rest is the commit's metadata (`encode`), so a consumer that takes the partition over knows what
 * to skip and how many deliveries each message had, and a publisher knows whether a message is done.
 */
export class PartitionLedger {
  /** null until the first message is seen when the group had no committed offset (it starts at the earliest). */
  base: bigint | null;
  /** Every offset below this has been seen (or is known not to exist): fetches go forward from `base`. */
  #scanned: bigint | null;
  /** Sorted, disjoint, half-open [start, end) ranges above `base`. */
  readonly #acked: Array<[bigint, bigint]> = [];
  readonly #deliveries = new Map<bigint, number>();

  private constructor(base: bigint | null) {
    this.base = base;
    this.#scanned = base;
  }

  static empty(): PartitionLedger {
    return new PartitionLedger(null);
  }

  /** From a committed offset ('-1' or '' when none) and its metadata (anything not ours is ignored: then only the offset counts). */
  static restore(committed: string | null | undefined, metadata: string | null | undefined): PartitionLedger {
    const base = validOffset(committed);
    const ledger = new PartitionLedger(base);
    if (base === null) return ledger;
    const decoded = decodeLedgerMetadata(metadata);
    if (!decoded) return ledger;
    for (let i = 0; i + 1 < decoded.a.length; i += 2) ledger.#addAcked(base + BigInt(decoded.a[i]), base + BigInt(decoded.a[i + 1]));
    for (let i = 0; i + 1 < decoded.d.length; i += 2) {
      const offset = base + BigInt(decoded.d[i]);
      if (!ledger.isAcknowledged(offset) && decoded.d[i + 1] > 0) ledger.#deliveries.set(offset, decoded.d[i + 1]);
    }
    ledger.#advance();
    return ledger;
  }

  /**
   * A fetched message's offset, in fetch order: `acknowledged` (skip it) or `open` (to deliver, unless
   * already held). Offsets skipped between two fetched messages do not exist (compacted, transaction
   * markers, removed by retention) and count as acknowledged, so they never hold `base` back.
   */
  see(offset: bigint): 'acknowledged' | 'open' {
    if (this.base === null) this.base = this.#scanned = offset;
    if (this.#scanned !== null && offset > this.#scanned) this.#addAcked(this.#scanned, offset);
    if (this.#scanned === null || offset >= this.#scanned) this.#scanned = offset + 1n;
    this.#advance();
    return this.isAcknowledged(offset) ? 'acknowledged' : 'open';
  }

  isAcknowledged(offset: bigint): boolean {
    if (this.base === null) return false;
    if (offset < this.base) return true;
    return this.#acked.some(([start, end]) => offset >= start && offset < end);
  }

  deliveriesOf(offset: bigint): number {
    return this.#deliveries.get(offset) ?? 0;
  }

  /** A delivery begins: its count, this one included. */
  begin(offset: bigint): number {
    const deliveries = this.deliveriesOf(offset) + 1;
    this.#deliveries.set(offset, deliveries);
    return deliveries;
  }

  /** A delivery that never reached its handler (its consumer stopped first): not counted. */
  unbegin(offset: bigint): void {
    const deliveries = this.deliveriesOf(offset) - 1;
    if (deliveries > 0) this.#deliveries.set(offset, deliveries);
    else this.#deliveries.delete(offset);
  }

  acknowledge(offset: bigint): void {
    if (this.base === null || this.isAcknowledged(offset)) return;
    this.#deliveries.delete(offset);
    this.#addAcked(offset, offset + 1n);
    this.#advance();
  }

  /**
   * Adds what a group's commit says (another member's, made while this one was out of the group): its
   * acknowledgements join these, and a delivery count is the larger of the two. Nothing acknowledged
   * here is taken back, so a commit made from the result moves the group's offset forward only.
   */
  absorb(committed: string | null | undefined, metadata: string | null | undefined): void {
    const other = PartitionLedger.restore(committed, metadata);
    if (other.base === null) return;
    if (this.base === null) this.base = this.#scanned = other.base;
    if (other.base > this.base) this.#addAcked(this.base, other.base);
    if (this.#scanned === null || other.base > this.#scanned) this.#scanned = other.base;
    for (const [start, end] of other.#acked) this.#addAcked(start, end);
    for (const [offset, deliveries] of other.#deliveries) {
      if (!this.isAcknowledged(offset) && deliveries > this.deliveriesOf(offset)) this.#deliveries.set(offset, deliveries);
    }
    this.#advance();
  }

  /** The commit's metadata: the acknowledged ranges and the deliveries, relative to `base`. */
  encode(): string {
    const base = this.base ?? 0n;
    const a = this.#acked.flatMap(([start, end]) => [Number(start - base), Number(end - base)]);
    const d = [...this.#deliveries].sort(([x], [y]) => (x < y ? -1 : 1)).flatMap(([offset, n]) => [Number(offset - base), n]);
    return JSON.stringify({ v: 1, a, d });
  }

  #addAcked(start: bigint, end: bigint): void {
    if (end <= start) return;
    for (const offset of this.#deliveries.keys()) if (offset >= start && offset < end) this.#deliveries.delete(offset);
    const ranges = this.#acked;
    ranges.push([start, end]);
    ranges.sort(([x], [y]) => (x < y ? -1 : x > y ? 1 : 0));
    const merged: Array<[bigint, bigint]> = [];
    for (const range of ranges) {
      const last = merged[merged.length - 1];
      if (last && range[0] <= last[1]) last[1] = range[1] > last[1] ? range[1] : last[1];
      else merged.push([range[0], range[1]]);
    }
    ranges.splice(0, ranges.length, ...merged);
  }

  /** Moves `base` over the acknowledged offsets right above it. */
  #advance(): void {
    if (this.base === null) return;
    while (this.#acked.length > 0 && this.#acked[0][0] <= this.base) {
      const [, end] = this.#acked.shift()!;
      if (end > this.base) this.base = end;
    }
    for (const offset of this.#deliveries.keys()) if (offset < this.base) this.#deliveries.delete(offset);
  }
}

function validOffset(value: string | null | undefined): bigint | null {
  if (value === null || value === undefined || !/^\d+$/.test(value)) return null;
  return BigInt(value);
}

/** Our commit metadata, or null for anything else (another tool's commit, a reset, an older format). */
export function decodeLedgerMetadata(metadata: string | null | undefined): { a: number[]; d: number[] } | null {
  if (!metadata) return null;
  try {
    const parsed = JSON.parse(metadata) as { v?: unknown; a?: unknown; d?: unknown };
    const numbers = (value: unknown) => Array.isArray(value) && value.length % 2 === 0 && value.every((n) => Number.isSafeInteger(n) && n >= 0);
    if (parsed?.v !== 1 || !numbers(parsed.a) || !numbers(parsed.d)) return null;
    return { a: parsed.a as number[], d: parsed.d as number[] };
  } catch {
    return null;
  }
}

/** Whether the group has acknowledged the message at `offset`, by its committed offset and metadata. */
export function acknowledgedIn(committed: string | null | undefined, metadata: string | null | undefined, offset: bigint): boolean {
  return PartitionLedger.restore(committed, metadata).isAcknowledged(offset);
}

// --- assignment: a partition with a handler running stays with its consumer -------------------------

/** A member's subscription: its topics, and the partitions where it holds messages begun (running or backing off). */
export interface AssignmentMember {
  memberId: string;
  topics: string[];
  busy: Record<string, number[]>;
}

/**
 * Partitions to members: a partition a member holds a message begun in stays with it (two members
 * claiming one, after a partition moved under a stale member: the first by id); the others go one by
 * one to the member with the fewest, so a member that joins takes the free partitions first. A
 * rebalance thus never takes a running handler's message away from it.
 */
export function planAssignment(members: AssignmentMember[], topics: Array<{ topic: string; partitions: number[] }>): Map<string, Record<string, number[]>> {
  const sorted = [...members].sort((a, b) => (a.memberId < b.memberId ? -1 : a.memberId > b.memberId ? 1 : 0));
  const plan = new Map<string, Record<string, number[]>>(sorted.map((m) => [m.memberId, {}]));
  const counts = new Map<string, number>(sorted.map((m) => [m.memberId, 0]));
  const give = (memberId: string, topic: string, partition: number) => {
    const assignment = plan.get(memberId)!;
    (assignment[topic] ??= []).push(partition);
    counts.set(memberId, counts.get(memberId)! + 1);
  };
  const free: Array<{ topic: string; partition: number; members: AssignmentMember[] }> = [];
  for (const { topic, partitions } of topics) {
    const subscribed = sorted.filter((m) => m.topics.includes(topic));
    if (subscribed.length === 0) continue;
    for (const partition of [...partitions].sort((a, b) => a - b)) {
      const holder = subscribed.find((m) => m.busy[topic]?.includes(partition));
      if (holder) give(holder.memberId, topic, partition);
      else free.push({ topic, partition, members: subscribed });
    }
  }
  for (const { topic, partition, members: candidates } of free) {
    let least = candidates[0];
    for (const m of candidates) if (counts.get(m.memberId)! < counts.get(least.memberId)!) least = m;
    give(least.memberId, topic, partition);
  }
  for (const assignment of plan.values()) for (const partitions of Object.values(assignment)) partitions.sort((a, b) => a - b);
  return plan;
}

export const encodeBusy = (busy: Record<string, number[]>): Buffer => Buffer.from(JSON.stringify({ v: 1, busy }));

export function decodeBusy(userData: Buffer | null | undefined): Record<string, number[]> {
  try {
    const parsed = JSON.parse((userData ?? Buffer.alloc(0)).toString('utf8')) as { v?: unknown; busy?: unknown };
    if (parsed?.v !== 1 || typeof parsed.busy !== 'object' || parsed.busy === null) return {};
    const busy: Record<string, number[]> = {};
    for (const [topic, partitions] of Object.entries(parsed.busy)) if (Array.isArray(partitions)) busy[topic] = partitions.filter((p) => Number.isSafeInteger(p));
    return busy;
  } catch {
    return {};
  }
}

/** The kafkajs assigner over `planAssignment`; `subscription` is asked at every join what this member holds. */
export function busyStickyAssigner(subscription: () => Record<string, number[]>): PartitionAssigner {
  return ({ cluster }) => {
    const assigner: Assigner = {
      name: kafkaAssignerName,
      version: 1,
      async assign({ members, topics }) {
        const decoded = members.map(({ memberId, memberMetadata }) => {
          const metadata = AssignerProtocol.MemberMetadata.decode(memberMetadata);
          return { memberId, topics: metadata?.topics ?? [], busy: decodeBusy(metadata?.userData) };
        });
        const partitions = topics.map((topic) => ({ topic, partitions: cluster.findTopicPartitionMetadata(topic).map((m) => m.partitionId) }));
        const plan = planAssignment(decoded, partitions);
        return [...plan].map(([memberId, assignment]) => ({
          memberId,
          memberAssignment: AssignerProtocol.MemberAssignment.encode({ version: assigner.version, assignment, userData: Buffer.alloc(0) }),
        }));
      },
      protocol({ topics }) {
        return { name: assigner.name, metadata: AssignerProtocol.MemberMetadata.encode({ version: assigner.version, topics, userData: encodeBusy(subscription()) }) };
      },
    };
    return assigner;
  };
}

// --- the transport ----------------------------------------------------------------------------------

/** The transport, with a way to wait for (or fail fast on) its connections. */
export interface KafkaDispatchTransport extends DispatchTransport {
  /** Resolves once the admin client and the producer are connected; publishing and consuming wait for it by themselves. */
  ready(): Promise<void>;
}

interface Sent {
  partition: number;
  offset: bigint;
}

/** A message fetched and not acknowledged, held by its partition in the consumer. */
interface Held {
  readonly offset: bigint;
  readonly key: string;
  readonly value: Buffer | null;
  /** Publish time (the record's timestamp), then the publisher's sequence: the order handlers start in. */
  readonly order: readonly [number, number];
  /** `arriving`: fetched in a response not yet wholly handed over; `ready`: to deliver. */
  state: 'arriving' | 'ready' | 'starting' | 'running' | 'backoff';
  controller: AbortController;
  settled?: Promise<void>;
  timer?: NodeJS.Timeout;
}

interface PartitionState {
  readonly partition: number;
  ledger: PartitionLedger | null;
  loading: Promise<PartitionLedger> | null;
  readonly held: Map<bigint, Held>;
  committer: Committer;
  paused: boolean;
  lost: boolean;
  /** Kept through a crash and given back: the group's commit (another member may have had the partition meanwhile) is being absorbed; nothing begins or is committed until then. */
  resync: Promise<void> | null;
}

/** One commit at a time per partition; `flush` resolves once a commit sent after it was called has ended. */
export class Committer {
  #requested = 0;
  #done = 0;
  #running = false;
  #waiters: Array<{ version: number; resolve: () => void }> = [];
  #retry: NodeJS.Timeout | undefined;
  /** The last commit failed: what is in memory is not in Kafka yet. */
  #unsaved = false;
  readonly #commit: () => Promise<void>;
  readonly #reportError: (error: unknown) => void;

  constructor(commit: () => Promise<void>, reportError: (error: unknown) => void) {
    this.#commit = commit;
    this.#reportError = reportError;
  }

  flush(): Promise<void> {
    const version = ++this.#requested;
    const done = new Promise<void>((resolve) => this.#waiters.push({ version, resolve }));
    void this.#run();
    return done;
  }

  /** Changes not yet in Kafka (being committed, or their commit failed). */
  get dirty(): boolean {
    return this.#running || this.#done < this.#requested || this.#unsaved;
  }

  /** Resolves once what is in memory was committed (or its last try failed, reported). */
  async idle(): Promise<void> {
    clearTimeout(this.#retry);
    if (this.dirty) await this.flush();
  }

  cancel(): void {
    clearTimeout(this.#retry);
  }

  async #run(): Promise<void> {
    if (this.#running) return;
    this.#running = true;
    try {
      while (this.#done < this.#requested) {
        const version = this.#requested;
        try {
          await this.#commit();
          this.#unsaved = false;
        } catch (error) {
          this.#unsaved = true;
          this.#reportError(error);
          // the state is still in memory: committed again shortly (an acknowledgement not yet committed is only redelivered if this consumer dies)
          clearTimeout(this.#retry);
          this.#retry = setTimeout(() => void this.flush(), 1_000);
          this.#retry.unref();
        }
        this.#done = version;
        const waiting = this.#waiters.filter((w) => w.version <= version);
        this.#waiters = this.#waiters.filter((w) => w.version > version);
        for (const w of waiting) w.resolve();
      }
    } finally {
      this.#running = false;
    }
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
const seqHeader = 'svc-seq';

function headerNumber(message: KafkaMessage, name: string): number {
  const value = message.headers?.[name];
  const text = Buffer.isBuffer(value) ? value.toString('utf8') : typeof value === 'string' ? value : '';
  const n = Number(text);
  return Number.isFinite(n) ? n : 0;
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

  const topics = new Map<string, Promise<void>>();
  /** Creates the kind's topic when missing (an existing one is left as it is). */
  function ensureTopic(topic: string): Promise<void> {
    let made = topics.get(topic);
    if (!made) {
      made = ready()
        // (again on a retriable error: a fresh KRaft broker can answer UNKNOWN_TOPIC_OR_PARTITION while it waits for the leaders)
        .then(() => adminRead(() => admin.createTopics({ topics: [{ topic, numPartitions: partitions, replicationFactor: options.replicationFactor ?? -1 }], waitForLeaders: true })))
        .then(() => undefined);
      made.catch(() => topics.delete(topic));
      topics.set(topic, made);
    }
    return made;
  }

  /** Where this process last sent each kind and key, oldest first: what `publish` checks against the group's commits. */
  const sent = new Map<string, Sent>();
  const publishing = new Map<string, Promise<unknown>>();
  let sequence = 0;

  /** A broker's answer that holds only for a moment (kafkajs's protocol error, or that error under its retrier's). */
  const momentaryTypes = new Set(['UNKNOWN_TOPIC_OR_PARTITION', 'NOT_LEADER_FOR_PARTITION', 'NOT_LEADER_OR_FOLLOWER', 'LEADER_NOT_AVAILABLE']);
  function momentary(error: unknown): boolean {
    const seen = error as { retriable?: boolean; type?: string; cause?: unknown } | null;
    if (!seen) return false;
    if (seen.retriable === true || (seen.type !== undefined && momentaryTypes.has(seen.type))) return true;
    return seen.cause !== undefined && seen.cause !== error && momentary(seen.cause);
  }

  /**
   * An admin call, tried again (up to 5 times, 100 ms doubling) on an error Kafka calls retriable: a
   * partition's leader moving, or a fresh topic's metadata not yet in the client's cache, answer
   * NOT_LEADER_OR_FOLLOWER or UNKNOWN_TOPIC_OR_PARTITION for a moment (seen on a loaded single broker).
   * Only for calls that may be repeated: reads, and creating a topic (one that exists is left as it is).
   */
  async function adminRead<T>(read: () => Promise<T>): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      try {
        return await read();
      } catch (error) {
        if (attempt >= 4 || !momentary(error)) throw error;
        await new Promise((resolve) => setTimeout(resolve, 100 * 2 ** attempt));
      }
    }
  }

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

  function consume(kind: string, handler: DispatchHandler, consumeOptions?: ConsumeOptions): DispatchConsumer {
    const concurrency = concurrencyOf(consumeOptions);
    const topic = topicFor(topicPrefix, kind);
    const groupId = groupFor(groupPrefix, kind);
    const sessionTimeout = options.sessionTimeoutMs ?? kafkaDispatchDefaults.sessionTimeoutMs;
    const states = new Map<number, PartitionState>();
    const running = new Set<Held>();
    const runningKeys = new Map<string, number>();
    let stopping = false;
    /** From this member's join request to its assignment: nothing begins (the assignment was decided on what it held then). */
    let joining = true;
    /** Counts joins begun and ended (and crashes), so that what a join starts on the next turn is dropped once another has begun. */
    let joins = 0;
    let memberId: string | null = null;
    let arrivalTimer: NodeJS.Timeout | undefined;
    let restartTimer: NodeJS.Timeout | undefined;

    /**
     * Partitions to keep through a rebalance: a message begun there, or a change not yet committed (an
     * acknowledgement whose commit the rebalance refused would otherwise be lost, and the message delivered again).
     */
    const busyPartitions = () => {
      const busy = [...states.values()].filter(
        (s) => !s.lost && (s.committer.dirty || [...s.held.values()].some((h) => h.state === 'starting' || h.state === 'running' || h.state === 'backoff')),
      );
      return { [topic]: busy.map((s) => s.partition) };
    };

    const kafkaConsumer: Consumer = kafka.consumer({
      groupId,
      partitionAssigners: [
        busyStickyAssigner(() => {
          joining = true;
          joins++;
          return busyPartitions();
        }),
      ],
      sessionTimeout,
      heartbeatInterval: options.heartbeatIntervalMs ?? Math.min(kafkaDispatchDefaults.heartbeatIntervalMs, Math.floor(sessionTimeout / 3)),
      rebalanceTimeout: options.rebalanceTimeoutMs ?? kafkaDispatchDefaults.rebalanceTimeoutMs,
      maxWaitTimeInMs: options.fetchWaitMs ?? kafkaDispatchDefaults.fetchWaitMs,
      allowAutoTopicCreation: false,
    });

    function setPaused(state: PartitionState, paused: boolean): void {
      if (state.paused === paused) return;
      try {
        if (paused) kafkaConsumer.pause([{ topic, partitions: [state.partition] }]);
        else kafkaConsumer.resume([{ topic, partitions: [state.partition] }]);
        state.paused = paused;
      } catch {
        // the client is restarting: its new group starts unpaused, and the next batch pauses again if needed
      }
    }

    /**
     * The commits the broker took (kafkajs tells each one): kafkajs's `commitOffsets` resolves without
     * sending anything while its runner is not running (from a crash until its new group has joined, and
     * while a crash is being handled), so a commit counts as made only once it is seen here.
     */
    const landed = new Set<string>();
    kafkaConsumer.on(kafkaConsumer.events.COMMIT_OFFSETS, ({ payload }) => {
      for (const t of payload.topics) if (t.topic === topic) for (const p of t.partitions) landed.add(`${p.partition}@${p.offset}`);
    });

    function commitOf(state: PartitionState): () => Promise<void> {
      return async () => {
        if (state.resync) await state.resync;
        const ledger = state.ledger;
        // a partition taken from this consumer is never written to again: the new owner's commits are the truth
        if (state.lost || !ledger || ledger.base === null) return;
        const mark = `${state.partition}@${ledger.base}`;
        landed.delete(mark);
        await kafkaConsumer.commitOffsets([{ topic, partition: state.partition, offset: ledger.base.toString(), metadata: ledger.encode() }]);
        if (!landed.delete(mark)) throw new Error(`dispatch commit of ${topic}/${state.partition} not sent: the Kafka client is joining its group; tried again`);
      };
    }

    function stateOf(partition: number): PartitionState {
      let state = states.get(partition);
      if (!state) {
        const made = { partition, ledger: null, loading: null, held: new Map(), paused: false, lost: false, resync: null } as unknown as PartitionState;
        made.committer = new Committer(commitOf(made), reportError);
        states.set(partition, (state = made));
      }
      return state;
    }

    /** The partitions' ledgers, from the group's commits, in one request. */
    function load(fresh: PartitionState[]): void {
      const pending = fresh.filter((s) => !s.ledger && !s.loading);
      if (pending.length === 0) return;
      const fetched = ready().then(() => admin.fetchOffsets({ groupId, topics: [topic] }));
      for (const state of pending) {
        state.loading = fetched.then(([offsets]) => {
          const committed = offsets?.partitions.find((p) => p.partition === state.partition);
          state.ledger ??= PartitionLedger.restore(committed?.offset, committed?.metadata);
          return state.ledger;
        });
        state.loading.catch(() => (state.loading = null)); // the next batch tries again
      }
    }

    /**
     * Partitions kept through a crash and given back: another member may have had them meanwhile and
     * acknowledged messages, committed past what this one knows. Its commit is absorbed before anything
     * here begins or commits, so a commit from here never takes an acknowledgement back.
     */
    function resync(kept: PartitionState[]): void {
      if (kept.length === 0) return;
      const fetched = ready().then(() => admin.fetchOffsets({ groupId, topics: [topic] }));
      for (const state of kept) {
        const done: Promise<void> = fetched
          .then(([offsets]) => {
            const committed = offsets?.partitions.find((p) => p.partition === state.partition);
            state.ledger?.absorb(committed?.offset, committed?.metadata);
          })
          .catch((error: unknown) => reportError(error)) // what this member knows is committed as it is: at worst, messages come again
          .finally(() => {
            if (state.resync === done) state.resync = null;
            schedule();
          });
        state.resync = done;
      }
    }

    /** The partition is another member's now: its handlers are told, its messages forgotten (never acknowledged from here). */
    function lose(state: PartitionState): void {
      state.lost = true;
      state.committer.cancel();
      states.delete(state.partition);
      for (const held of state.held.values()) {
        clearTimeout(held.timer);
        if (held.state === 'starting' || held.state === 'running') held.controller.abort(new DispatchLeaseLost(`${topic}/${state.partition}/${held.offset}`));
      }
      state.held.clear();
    }

    function loseAll(): void {
      for (const state of [...states.values()]) lose(state);
    }

    kafkaConsumer.on(kafkaConsumer.events.GROUP_JOIN, ({ payload }) => {
      // a new member id: this one was out of the group for a while, and what it knew may be stale
      if (memberId !== null && payload.memberId !== memberId) loseAll();
      const afterCrash = memberId === null;
      memberId = payload.memberId;
      const assigned = new Set(payload.memberAssignment[topic] ?? []);
      for (const state of [...states.values()]) if (!assigned.has(state.partition)) lose(state);
      if (afterCrash) resync([...states.values()].filter((s) => s.ledger));
      load([...assigned].map(stateOf));
      // after a crash the client's new group starts unpaused: a partition still full is paused again
      for (const state of states.values()) if (state.held.size >= maxHeld) setPaused(state, true);
      // What a commit refused during the rebalance is committed now, under the new generation, and the
      // held messages begin (their deliveries committed first): on the next turn, as after a crash the
      // client marks itself running only once this event has been told, and drops commits until then.
      const join = ++joins;
      setImmediate(() => {
        if (join !== joins) return; // joining again already (or crashed)
        for (const state of states.values()) if (state.committer.dirty) void state.committer.flush();
        joining = false;
        schedule();
      });
    });

    kafkaConsumer.on(kafkaConsumer.events.CRASH, ({ payload }) => {
      reportError(payload.error);
      // a crash while stopping may still be restarted by the client (its timer is set right after this event): stopped again
      if (stopping) setImmediate(() => void kafkaConsumer.disconnect().catch(() => {}));
      // The client left the group (or lost the brokers: the usual crash) and joins again as a new member.
      // Its handlers run on meanwhile (their work needs no broker) and nothing new begins; the partitions
      // they hold are reported busy in that join, so the assignment gives them back, or takes them (lose).
      for (const state of states.values()) state.paused = false; // the client's next group starts unpaused
      memberId = null;
      joining = true;
      joins++;
      if (!payload.restart && !stopping) {
        clearTimeout(restartTimer);
        restartTimer = setTimeout(() => void run(), kafkaDispatchDefaults.restartMs);
      }
    });

    // A fetch starts once the previous response's batches were all handed over: the messages they
    // brought may begin now, oldest first across the partitions, whatever order the batches came in.
    kafkaConsumer.on(kafkaConsumer.events.FETCH_START, () => promoteArrivals());

    function promoteArrivals(): void {
      clearTimeout(arrivalTimer);
      arrivalTimer = undefined;
      for (const state of states.values()) for (const held of state.held.values()) if (held.state === 'arriving') held.state = 'ready';
      schedule();
    }

    async function onBatch({ batch, resolveOffset }: EachBatchPayload): Promise<void> {
      const state = states.get(batch.partition);
      if (!state || state.lost || batch.topic !== topic) return;
      let ledger: PartitionLedger;
      try {
        load([state]);
        ledger = state.ledger ?? (await state.loading!);
        if (state.resync) await state.resync;
      } catch (error) {
        reportError(error);
        await sleep(500); // unresolved: the same messages are fetched again
        return;
      }
      if (state.lost) return;
      for (const message of batch.messages) {
        const offset = BigInt(message.offset);
        if (ledger.see(offset) === 'acknowledged' || state.held.has(offset)) continue;
        state.held.set(offset, {
          offset,
          key: message.key?.toString('utf8') ?? '',
          value: message.value,
          order: [Number(message.timestamp), headerNumber(message, seqHeader)],
          state: 'arriving',
          controller: new AbortController(),
        });
      }
      const last = batch.messages[batch.messages.length - 1];
      if (last) resolveOffset(last.offset);
      if (state.held.size >= maxHeld) setPaused(state, true);
      // should no next fetch start soon (a rebalance), the messages still begin
      arrivalTimer ??= setTimeout(promoteArrivals, 1_000);
    }

    function pickNext(): { state: PartitionState; held: Held } | null {
      let best: { state: PartitionState; held: Held } | null = null;
      for (const state of states.values()) {
        if (state.lost || !state.ledger || state.resync) continue;
        for (const held of state.held.values()) {
          if (held.state !== 'ready' || runningKeys.has(held.key)) continue;
          if (!best || before(held, state, best.held, best.state)) best = { state, held };
        }
      }
      return best;
    }
    const before = (a: Held, as: PartitionState, b: Held, bs: PartitionState) =>
      a.order[0] !== b.order[0] ? a.order[0] < b.order[0] : a.order[1] !== b.order[1] ? a.order[1] < b.order[1] : as.partition !== bs.partition ? as.partition < bs.partition : a.offset < b.offset;

    function schedule(): void {
      while (!stopping && !joining && running.size < concurrency) {
        const next = pickNext();
        if (!next) return;
        begin(next.state, next.held);
      }
    }

    function begin(state: PartitionState, held: Held): void {
      const ledger = state.ledger!;
      held.state = 'starting';
      held.controller = new AbortController();
      running.add(held);
      runningKeys.set(held.key, (runningKeys.get(held.key) ?? 0) + 1);
      const deliveries = ledger.begin(held.offset);
      const id = `${topic}/${state.partition}/${held.offset}`;
      held.settled = (async () => {
        let payload: Record<string, unknown>;
        try {
          const parsed: unknown = JSON.parse(held.value?.toString('utf8') ?? '');
          if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new Error('not a JSON object');
          payload = parsed as Record<string, unknown>;
        } catch (error) {
          // not a message of this transport's: skipped (acknowledged), or it would stop its partition forever
          reportError(new Error(`dispatch message ${id} has no JSON object as its value (${(error as Error).message}); skipped`));
          ledger.unbegin(held.offset);
          return acknowledge(state, held);
        }
        // the delivery is counted in the group's commit before a handler sees it, so a consumer that dies still counts it
        await state.committer.flush();
        if (state.lost) return;
        if (stopping) {
          // handed back at once, uncounted, for the next owner
          ledger.unbegin(held.offset);
          held.state = 'ready';
          return state.committer.flush();
        }
        held.state = 'running';
        const message: DispatchMessage = Object.freeze({ id, kind, key: held.key, payload, deliveries });
        const signal = held.controller.signal;
        try {
          await handler(message, signal);
        } catch (error) {
          reportError(error, message);
          if (state.lost || signal.reason instanceof DispatchLeaseLost) return;
          if (signal.aborted) {
            held.state = 'ready'; // stopped mid-way: the next owner delivers it at once
            return;
          }
          held.state = 'backoff';
          held.timer = setTimeout(() => {
            if (held.state !== 'backoff') return;
            held.state = 'ready';
            schedule();
          }, retryDelayMs(deliveries, options));
          return;
        }
        if (state.lost) return;
        await acknowledge(state, held);
      })()
        .catch((error: unknown) => reportError(error))
        .finally(() => {
          running.delete(held);
          const left = (runningKeys.get(held.key) ?? 1) - 1;
          if (left > 0) runningKeys.set(held.key, left);
          else runningKeys.delete(held.key);
          schedule();
        });
    }

    async function acknowledge(state: PartitionState, held: Held): Promise<void> {
      state.ledger!.acknowledge(held.offset);
      state.held.delete(held.offset);
      if (state.held.size < maxHeld) setPaused(state, false);
      await state.committer.flush();
    }

    /** Starts (or starts again) the client: the topic, the subscription and the run. */
    async function run(): Promise<void> {
      while (!stopping) {
        try {
          await ensureTopic(topic);
          if (stopping) return;
          await kafkaConsumer.connect();
          await kafkaConsumer.subscribe({ topics: [topic], fromBeginning: true });
          if (stopping) return;
          await kafkaConsumer.run({ autoCommit: false, eachBatchAutoResolve: false, partitionsConsumedConcurrently: 1, eachBatch: onBatch });
          return;
        } catch (error) {
          reportError(error);
          await sleep(kafkaDispatchDefaults.restartMs);
        }
      }
    }
    const started = run();

    return lifecycle.consumer({
      halt() {
        stopping = true;
        clearTimeout(arrivalTimer);
        clearTimeout(restartTimer);
        try {
          kafkaConsumer.pause([{ topic }]);
        } catch {
          // not running: nothing is fetched anyway
        }
      },
      running,
      async release() {
        for (const state of states.values()) {
          for (const held of state.held.values()) clearTimeout(held.timer);
          await state.committer.idle();
        }
        await started;
        // leaving the group hands its partitions to the other members at once (not after the session timeout)
        await kafkaConsumer.disconnect().catch((error: unknown) => reportError(error));
      },
    });
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

      consume,

      async release() {
        await Promise.all([...publishing.values()].map((p) => p.catch(() => {})));
        await Promise.all([producer.disconnect(), admin.disconnect()]).catch((error: unknown) => reportError(error));
      },
    }),
    ready,
  };
}
