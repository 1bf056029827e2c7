/**
 * The Kafka transport. Its pure parts run always: topic and group names, the partition ledger kept in
 * the group's commit (acknowledgements out of order, deliveries, gaps, the metadata's size), the
 * publish check against a commit, and the assignment that keeps a busy partition with its consumer
 * (through kafkajs's own codec). The dispatch contract and the Kafka-only tests run against a real
 * cluster when KAFKA_BROKERS is set (e.g. 127.0.0.1:9092), and are reported skipped otherwise (none
 * is faked).
 *
 * A broker for them: infra/dev/services.sh starts one KRaft node with `group.initial.rebalance.delay.ms=0` (as in
 * Kafka's sample server.properties): the built-in 3 s makes each new group's first join wait that
 * long, close to the contract's 5 s bounds.
 */
import { randomBytes, randomUUID } from 'node:crypto';
import { AssignerProtocol, Kafka, logLevel } from 'kafkajs';
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { DispatchClosed, kafkaTransport, type DispatchMessage, type DispatchTransport } from '../../src/dispatch/index.ts';
import {
  Committer,
  PartitionLedger,
  acknowledgedIn,
  busyStickyAssigner,
  decodeBusy,
  decodeLedgerMetadata,
  encodeBusy,
  groupFor,
  kafkaAssignerName,
  planAssignment,
  topicFor,
} from '../../src/dispatch/kafka.ts';
import { removeKafkaPrefix } from '../support/kafka.ts';
import { until } from '../support/until.ts';
import { within } from '../support/within.ts';
import { transportContract, type ContractTiming } from './transport-contract.ts';

const brokersVariable = process.env.KAFKA_BROKERS;

// --- names ------------------------------------------------------------------------------------------

const names = suite('kafka dispatch: topic and group names');

names('a kind with legal characters is its topic after the prefix; its group likewise', () => {
  assert.is(topicFor('svc.dispatch.', 'harvest'), 'svc.dispatch.harvest');
  assert.is(topicFor('svc.dispatch.', 'job-1a2b_c.d'), 'svc.dispatch.job-1a2b_c.d');
  assert.is(groupFor('svc.dispatch.', 'harvest'), 'svc.dispatch.harvest');
  assert.is(groupFor('g/', 'a kind with spaces'), 'g/a kind with spaces');
});

names('a kind Kafka would refuse is made legal and told apart by a hash, so two kinds never share a topic', () => {
  const slash = topicFor('p.', 'a/b');
  const underscore = topicFor('p.', 'a_b');
  const space = topicFor('p.', 'a b');
  assert.match(slash, /^p\.a_b-[0-9a-f]{16}$/);
  assert.is(underscore, 'p.a_b');
  assert.is.not(slash, space);
  for (const name of [slash, space, topicFor('p.', 'émoji 🚀'), topicFor('bad prefix/', 'k')]) assert.match(name, /^[A-Za-z0-9._-]+$/);
});

names('a kind too long for a topic name is cut to 249 characters, still distinct', () => {
  const long = 'x'.repeat(300);
  const a = topicFor('svc.dispatch.', long);
  const b = topicFor('svc.dispatch.', `${long}y`);
  assert.ok(a.length <= 249, `${a.length}`);
  assert.is.not(a, b);
  assert.throws(() => topicFor('svc.', ''), (e: unknown) => e instanceof RangeError);
});

names.run();

// --- the ledger -------------------------------------------------------------------------------------

const ledger = suite('kafka dispatch: the partition ledger in the group commit');

ledger('a group with no commit starts at the first message seen; acknowledgements out of order hold the base at the oldest open one', () => {
  const l = PartitionLedger.restore('-1', null);
  assert.is(l.base, null);
  for (const offset of [5n, 6n, 7n, 8n]) assert.is(l.see(offset), 'open');
  assert.is(l.base, 5n);
  l.acknowledge(6n);
  l.acknowledge(8n);
  assert.is(l.base, 5n, 'the oldest is still open');
  assert.ok(l.isAcknowledged(6n) && l.isAcknowledged(8n));
  assert.not.ok(l.isAcknowledged(5n) || l.isAcknowledged(7n));
  l.acknowledge(5n);
  assert.is(l.base, 7n);
  l.acknowledge(7n);
  assert.is(l.base, 9n, 'past everything acknowledged');
});

ledger('offsets skipped between two fetched messages (compacted, transaction markers) count as acknowledged, so they never hold the base', () => {
  const l = PartitionLedger.restore('10', null);
  l.see(10n);
  l.see(13n); // 11 and 12 do not exist
  l.acknowledge(10n);
  assert.is(l.base, 13n);
  assert.is(l.see(12n), 'acknowledged');
});

ledger('deliveries are counted per message, survive the commit, and a delivery handed back uncounted is taken off', () => {
  const l = PartitionLedger.restore('0', null);
  l.see(0n);
  l.see(1n);
  assert.is(l.begin(0n), 1);
  assert.is(l.begin(0n), 2);
  assert.is(l.begin(1n), 1);
  l.unbegin(1n);
  const again = PartitionLedger.restore('0', l.encode());
  assert.is(again.deliveriesOf(0n), 2);
  assert.is(again.deliveriesOf(1n), 0);
  assert.is(again.begin(0n), 3, 'the next delivery after a takeover');
});

ledger('the commit carries acknowledged ranges and deliveries relative to the committed offset; a takeover skips what was done', () => {
  const l = PartitionLedger.restore('100', null);
  for (let o = 100n; o < 110n; o++) l.see(o);
  l.begin(100n);
  l.begin(100n);
  for (const o of [101n, 102n, 103n, 105n, 109n]) {
    l.begin(o);
    l.acknowledge(o);
  }
  l.begin(104n);
  assert.is(l.base, 100n);
  assert.equal(decodeLedgerMetadata(l.encode()), { a: [1, 4, 5, 6, 9, 10], d: [0, 2, 4, 1] });
  const next = PartitionLedger.restore(l.base!.toString(), l.encode());
  const open = [];
  for (let o = 100n; o < 112n; o++) if (next.see(o) === 'open') open.push(Number(o));
  assert.equal(open, [100, 104, 106, 107, 108, 110, 111]);
  assert.is(next.deliveriesOf(100n), 2);
  assert.is(next.deliveriesOf(104n), 1);
  assert.is(next.deliveriesOf(106n), 0);
});

ledger('a commit whose metadata is not ours (a reset, another tool) counts by its offset alone', () => {
  for (const metadata of [null, '', 'x', '{"v":2,"a":[],"d":[]}', '{"v":1,"a":[1],"d":[]}', '{"v":1,"a":[-1,2],"d":[]}', '{"v":1,"a":"1-2","d":[]}']) {
    assert.is(decodeLedgerMetadata(metadata), null, String(metadata));
    const l = PartitionLedger.restore('7', metadata);
    assert.is(l.base, 7n);
    assert.ok(l.isAcknowledged(6n));
    assert.not.ok(l.isAcknowledged(8n));
  }
});

ledger('the metadata of a full partition (100 held, one stuck at the base, a million offsets on) fits a commit (4,096 bytes by default)', () => {
  const base = 5_000_000_000n;
  const l = PartitionLedger.restore(base.toString(), null);
  l.see(base);
  l.begin(base);
  // 99 more held, each 10,101 offsets after the last (the ones between acknowledged), the last a million on
  let offset = base;
  for (let i = 0; i < 99; i++) {
    offset += 10_101n;
    l.see(offset);
    for (let d = 0; d < 60; d++) l.begin(offset);
  }
  assert.ok(l.isAcknowledged(base + 1n) && !l.isAcknowledged(base + 10_101n));
  const metadata = l.encode();
  assert.ok(metadata.length < 4_096, `${metadata.length} bytes`);
  assert.is(PartitionLedger.restore(l.base!.toString(), metadata).deliveriesOf(offset), 60);
});

ledger("a member back from a crash absorbs the commit another member made meanwhile: acknowledgements join, deliveries take the larger count, nothing goes back", () => {
  const mine = PartitionLedger.restore('10', null);
  for (const offset of [10n, 11n, 12n, 13n, 14n]) mine.see(offset);
  mine.begin(10n);
  mine.acknowledge(12n);
  mine.begin(14n);
  // the other member acknowledged 10 and 11 (its offset 12) and 14, and delivered 13 twice
  mine.absorb('12', JSON.stringify({ v: 1, a: [2, 3], d: [1, 2] }));
  assert.is(mine.base, 13n, '10, 11 (theirs) and 12 (mine) are done');
  assert.ok(mine.isAcknowledged(14n), 'theirs');
  assert.is(mine.deliveriesOf(13n), 2);
  assert.is(mine.see(15n), 'open');
  // an older commit (a stale member's) takes nothing back
  mine.absorb('5', null);
  assert.is(mine.base, 13n);
  assert.equal(decodeLedgerMetadata(mine.encode()), { a: [1, 2], d: [0, 2] });
  // a ledger that had seen nothing starts at the group's commit
  const fresh = PartitionLedger.empty();
  fresh.absorb('7', JSON.stringify({ v: 1, a: [], d: [0, 3] }));
  assert.is(fresh.base, 7n);
  assert.is(fresh.deliveriesOf(7n), 3);
});

ledger('publish: a message is done once the group committed past it or acknowledged it above the commit', () => {
  assert.not.ok(acknowledgedIn('-1', null, 0n), 'no commit: waiting for a consumer');
  assert.not.ok(acknowledgedIn(undefined, undefined, 3n));
  assert.ok(acknowledgedIn('4', null, 3n));
  assert.not.ok(acknowledgedIn('4', null, 4n), 'the committed offset is the next to deliver');
  const l = PartitionLedger.restore('4', null);
  for (const o of [4n, 5n, 6n]) l.see(o);
  l.acknowledge(5n);
  assert.ok(acknowledgedIn('4', l.encode(), 5n));
  assert.not.ok(acknowledgedIn('4', l.encode(), 6n));
  assert.not.ok(acknowledgedIn('4', l.encode(), 7n), 'never seen by the group');
});

ledger('commits: one at a time, the flushes made meanwhile coalesced into one more that carries their changes; each resolves after a commit begun after it', async () => {
  let state = 0;
  const committed: number[] = [];
  let release = () => {};
  const commit = async () => {
    const snapshot = state;
    await new Promise<void>((resolve) => (release = resolve));
    committed.push(snapshot);
  };
  const committer = new Committer(commit, (e) => assert.unreachable(String(e)));
  state = 1;
  const first = committer.flush();
  state = 2;
  const second = committer.flush();
  state = 3;
  const third = committer.flush();
  assert.ok(committer.dirty);
  release();
  await first;
  assert.equal(committed, [1]);
  await new Promise((r) => setImmediate(r));
  release();
  await Promise.all([second, third]);
  assert.equal(committed, [1, 3], 'one more commit, with the last state');
  assert.not.ok(committer.dirty);
});

ledger('a commit that failed leaves the committer dirty (its partition stays with it through a rebalance) until one succeeds, tried again by itself', async () => {
  let failing = true;
  const errors: unknown[] = [];
  let commits = 0;
  const committer = new Committer(async () => {
    commits += 1;
    if (failing) throw new Error('REBALANCE_IN_PROGRESS');
  }, (e) => errors.push(e));
  await committer.flush();
  assert.is(errors.length, 1);
  assert.ok(committer.dirty, 'unsaved');
  failing = false;
  await until('tried again after a second', async () => !committer.dirty, 3_000, 20);
  assert.is(commits, 2);
  committer.cancel();
});

ledger.run();

// --- assignment -------------------------------------------------------------------------------------

const assignment = suite('kafka dispatch: a busy partition stays with its consumer');

const member = (memberId: string, busy: Record<string, number[]> = {}, topics = ['t']) => ({ memberId, topics, busy });
const plain = (plan: Map<string, Record<string, number[]>>) => Object.fromEntries([...plan].map(([id, a]) => [id, a.t ?? []]));

assignment('a member with a handler running keeps that partition; the free ones go to the member with fewest, a newcomer first', () => {
  const plan = planAssignment([member('b-new'), member('a-old', { t: [2] })], [{ topic: 't', partitions: [0, 1, 2, 3] }]);
  assert.equal(plain(plan), { 'a-old': [1, 2], 'b-new': [0, 3] });
  const heavy = planAssignment([member('a', { t: [0, 1, 2] }), member('b')], [{ topic: 't', partitions: [0, 1, 2, 3, 4] }]);
  assert.equal(plain(heavy), { a: [0, 1, 2], b: [3, 4] });
});

assignment('one partition: its busy holder keeps it whoever joins; free, it goes to the first member by id', () => {
  assert.equal(plain(planAssignment([member('a'), member('z', { t: [0] })], [{ topic: 't', partitions: [0] }])), { a: [], z: [0] });
  assert.equal(plain(planAssignment([member('z'), member('a')], [{ topic: 't', partitions: [0] }])), { a: [0], z: [] });
});

assignment('two members claiming one partition (a stale one): the first by id; a member not subscribed to a topic gets none of it', () => {
  const plan = planAssignment([member('b', { t: [0] }), member('a', { t: [0] }), member('c', {}, ['other'])], [{ topic: 't', partitions: [0, 1] }]);
  assert.equal(plain(plan), { a: [0], b: [1], c: [] });
});

assignment("through kafkajs's codec: what a member holds travels in its join, and the leader's plan comes back as each member's assignment", async () => {
  let busy: Record<string, number[]> = { t: [2] };
  const cluster = { findTopicPartitionMetadata: () => [0, 1, 2].map((partitionId) => ({ partitionId })) };
  const assigner = busyStickyAssigner(() => busy)({ cluster, groupId: 'g', logger: undefined } as never);
  assert.is(assigner.name, kafkaAssignerName);
  const first = assigner.protocol({ topics: ['t'] });
  busy = {};
  const second = assigner.protocol({ topics: ['t'] });
  assert.equal(decodeBusy(AssignerProtocol.MemberMetadata.decode(first.metadata)?.userData), { t: [2] });
  const plan = await assigner.assign({ members: [{ memberId: 'm1', memberMetadata: second.metadata }, { memberId: 'm2', memberMetadata: first.metadata }], topics: ['t'] });
  const decoded = Object.fromEntries(plan.map((p) => [p.memberId, AssignerProtocol.MemberAssignment.decode(p.memberAssignment)?.assignment.t ?? []]));
  assert.equal(decoded, { m1: [0, 1], m2: [2] }, 'without what m2 holds it would get 1');
});

assignment('what a member holds is read back as sent, and anything else as nothing', () => {
  assert.equal(decodeBusy(encodeBusy({ t: [0, 3] })), { t: [0, 3] });
  for (const junk of [null, Buffer.alloc(0), Buffer.from('nope'), Buffer.from('{"v":2,"busy":{"t":[1]}}'), Buffer.from('{"v":1,"busy":null}')]) assert.equal(decodeBusy(junk), {});
  assert.equal(decodeBusy(Buffer.from('{"v":1,"busy":{"t":[1,"x",2.5]}}')), { t: [1] });
});

assignment.run();

// --- the transport without a broker -----------------------------------------------------------------

const options = suite('kafka dispatch: options (no broker contacted)');

options('brokers must be given as host:port, partitions and the held bound in range', () => {
  for (const brokers of [[], ['localhost'], ['localhost:'], ['a b:9092']]) {
    assert.throws(() => kafkaTransport({ brokers }), (e: unknown) => e instanceof RangeError, JSON.stringify(brokers));
  }
  assert.throws(() => kafkaTransport({ brokers: ['127.0.0.1:9092'], partitions: 0 }), (e: unknown) => e instanceof RangeError);
  assert.throws(() => kafkaTransport({ brokers: ['127.0.0.1:9092'], maxHeldPerPartition: 101 }), (e: unknown) => e instanceof RangeError);
});

options('a transport closed before it ever connected refuses to publish or consume; a bad concurrency is refused first', async () => {
  const transport = kafkaTransport({ brokers: ['127.0.0.1:9'] });
  assert.is(transport.name, 'kafka');
  assert.throws(() => transport.consume('job', async () => {}, { concurrency: 0 }), (e: unknown) => e instanceof RangeError);
  await within(5_000, transport.close(), 'close');
  try {
    await transport.publish('job', 'k', {});
    assert.unreachable('publish after close');
  } catch (error) {
    assert.instance(error, DispatchClosed);
  }
  assert.throws(() => transport.consume('job', async () => {}), (e: unknown) => e instanceof DispatchClosed);
});

options.run();

// --- against a cluster ------------------------------------------------------------------------------

if (!brokersVariable) {
  const reason = 'SKIPPED: KAFKA_BROKERS is not set (e.g. 127.0.0.1:9092); infra/dev/services.sh starts a broker; none is faked';
  console.log(`kafka dispatch: the transport contract and the Kafka-only tests are ${reason}`);
  const skipped = suite('dispatch transport contract (kafka)');
  skipped.skip(`the dispatch transport contract against Kafka: ${reason}`, () => {});
  skipped.skip(`Kafka only (another transport's publish sees the acknowledgement; a delivery's count is in the group's commit): ${reason}`, () => {});
  skipped.run();
} else {
  const brokers = brokersVariable.split(',').map((b) => b.trim()).filter(Boolean);
  const prefix = `svc.test.${randomBytes(4).toString('hex')}.`;
  const open = (timing: Partial<ContractTiming> = {}) =>
    kafkaTransport({
      brokers,
      topicPrefix: prefix,
      groupPrefix: prefix,
      partitions: 4,
      retryBackoffMs: timing.retryBackoffMs,
      stopGraceMs: timing.stopGraceMs,
      // rebalances noticed within half a second; the brokers' least session timeout is 6 s by default
      heartbeatIntervalMs: 500,
      sessionTimeoutMs: 10_000,
      fetchWaitMs: 250,
    });

  /** Removes this run's topics and groups. */
  const cleanUp = () => removeKafkaPrefix(brokers, prefix);

  transportContract({
    name: 'kafka',
    async pair(timing) {
      return [open(timing), open(timing)];
    },
    teardown: cleanUp,
  });

  const it = suite<{ transports: DispatchTransport[] }>('kafka dispatch transport');
  it.before.each((context) => {
    context.transports = [];
  });
  it.after.each(async (context) => {
    await Promise.all(context.transports.map((t) => within(20_000, t.close(), 'a transport closes after a test')));
  });
  it.after(cleanUp);

  it("a publish from another transport (another process's) is refused while the message waits or runs, and accepted once the group committed it", async (context) => {
    const publisher = open();
    const worker = open();
    context.transports.push(publisher, worker);
    const kind = `job-${randomUUID().slice(0, 8)}`;
    const release = { open: () => {} };
    const running = new Promise<void>((resolve) => (release.open = resolve));
    const got: DispatchMessage[] = [];
    assert.is(await publisher.publish(kind, 'j', { n: 1 }), true);
    assert.is(await publisher.publish(kind, 'j', { n: 2 }), false, 'waiting');
    worker.consume(kind, async (message) => {
      got.push(message);
      if (got.length === 1) await running;
    });
    await until('the delivery', async () => got.length === 1, 15_000, 5);
    assert.is(await publisher.publish(kind, 'j', { n: 3 }), false, 'in flight in the other transport');
    release.open();
    await until('accepted once committed', () => publisher.publish(kind, 'j', { n: 4 }), 10_000, 20);
    await until('the new message', async () => got.length === 2, 10_000, 5);
    assert.equal(got.map((m) => m.payload.n), [1, 4]);
  });

  it("a delivery is counted in the group's commit before its handler runs, so a consumer that takes over counts on", async (context) => {
    const transport = open({ retryBackoffMs: 60_000 });
    context.transports.push(transport);
    const kind = `count-${randomUUID().slice(0, 8)}`;
    await transport.publish(kind, 'k', {});
    let started = false;
    const consumer = transport.consume(kind, async () => {
      started = true;
      throw new Error('fails once; its backoff outlasts the test');
    });
    await until('the failure', async () => started, 15_000, 5);
    await consumer.stop();
    const admin = new Kafka({ brokers, logLevel: logLevel.NOTHING }).admin();
    await admin.connect();
    try {
      const [offsets] = await admin.fetchOffsets({ groupId: groupFor(prefix, kind), topics: [topicFor(prefix, kind)] });
      const committed = offsets.partitions.find((p) => p.offset !== '-1');
      assert.ok(committed, 'a commit');
      assert.equal(decodeLedgerMetadata(committed!.metadata)?.d, [0, 1], 'one delivery of the message at the committed offset');
    } finally {
      await admin.disconnect();
    }
    const later: DispatchMessage[] = [];
    transport.consume(kind, async (m) => void later.push(m));
    await until('taken over without the backoff', async () => later.length === 1, 15_000, 5);
    assert.is(later[0].deliveries, 2);
  });

  it.run();
}
