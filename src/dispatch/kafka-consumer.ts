/**
 * The Kafka transport's consumer of one kind: a group member that fetches its partitions' messages,
 * holds them (pausing a partition that holds too many), begins them oldest first across its partitions,
 * one key at a time, counts each delivery in the group's commit before its handler sees it, retries a
 * failed handler after a backoff, and keeps its partitions through a rebalance while a handler runs.
 */
import type { Admin, Consumer, EachBatchPayload, Kafka, KafkaMessage } from 'kafkajs';
import type { TransportLifecycle } from './consumer-stop.ts';
import { groupFor, topicFor } from './kafka-admin.ts';
import { busyStickyAssigner } from './kafka-assignment.ts';
import type { PartitionLedger } from './kafka-ledger.ts';
import { kafkaDispatchDefaults, seqHeader, type KafkaDispatchOptions } from './kafka-options.ts';
import { ConsumerPartitions, type Held, type PartitionState } from './kafka-partitions.ts';
import { DispatchLeaseLost, concurrencyOf, retryDelayMs, type ConsumeOptions, type DispatchConsumer, type DispatchHandler, type DispatchMessage } from './types.ts';

/** What a consumer shares with its transport. */
export interface KafkaConsumerContext {
  readonly kafka: Kafka;
  readonly admin: Admin;
  readonly options: KafkaDispatchOptions;
  readonly lifecycle: TransportLifecycle;
  readonly topicPrefix: string;
  readonly groupPrefix: string;
  readonly maxHeld: number;
  ready(): Promise<void>;
  ensureTopic(topic: string): Promise<void>;
  reportError(error: unknown, message?: DispatchMessage): void;
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

function headerNumber(message: KafkaMessage, name: string): number {
  const value = message.headers?.[name];
  const text = Buffer.isBuffer(value) ? value.toString('utf8') : typeof value === 'string' ? value : '';
  const n = Number(text);
  return Number.isFinite(n) ? n : 0;
}

export function kafkaConsumer(c: KafkaConsumerContext, kind: string, handler: DispatchHandler, consumeOptions?: ConsumeOptions): DispatchConsumer {
  const { admin, lifecycle, maxHeld, options, reportError } = c;
  const concurrency = concurrencyOf(consumeOptions);
  const topic = topicFor(c.topicPrefix, kind);
  const groupId = groupFor(c.groupPrefix, kind);
  const sessionTimeout = options.sessionTimeoutMs ?? kafkaDispatchDefaults.sessionTimeoutMs;
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

  const kafkaConsumer: Consumer = c.kafka.consumer({
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
  const partitions = new ConsumerPartitions({ topic, groupId, admin, consumer: kafkaConsumer, ready: c.ready, reportError, schedule: () => schedule() });
  const states = partitions.states;

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

  kafkaConsumer.on(kafkaConsumer.events.GROUP_JOIN, ({ payload }) => {
    // a new member id: this one was out of the group for a while, and what it knew may be stale
    if (memberId !== null && payload.memberId !== memberId) partitions.loseAll();
    const afterCrash = memberId === null;
    memberId = payload.memberId;
    const assigned = new Set(payload.memberAssignment[topic] ?? []);
    for (const state of [...states.values()]) if (!assigned.has(state.partition)) partitions.lose(state);
    if (afterCrash) partitions.resync([...states.values()].filter((s) => s.ledger));
    partitions.load([...assigned].map((p) => partitions.stateOf(p)));
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
      partitions.load([state]);
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
        await c.ensureTopic(topic);
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
