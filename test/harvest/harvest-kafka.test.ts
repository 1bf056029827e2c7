/**
 * Harvests dispatched over a real Kafka broker (SVC_HARVEST_TRANSPORT=kafka) to `svc worker`
 * processes beside a gateway, on one PostgreSQL: jobs finish; the worker holding a job is killed and
 * the other one finishes it (the killed member's partitions come to it after the group's session
 * timeout), each shard recorded once; and a broker stopped for 20 s mid-harvest and started again on
 * its data: the worker holding the job works on and finishes it, each shard once, claimed once; submits
 * and polls meanwhile answer in the contract's envelope (never a 500) and tell the truth (a 503 leaves a
 * job failed at its start, a 202 runs); and the transport carries new jobs after it, every message
 * acknowledged in the group, the acknowledgement made while the broker was down included. The first two use
 * the broker KAFKA_BROKERS names (topics and groups of this run's own prefix); the last starts a broker
 * of its own (infra/dev/services.sh on free ports), never stopping the shared one. Skipped, with the
 * reason, without KAFKA_BROKERS, DATABASE_URL, or (the last) Java and Maven.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomBytes } from 'node:crypto';
import { Kafka, logLevel } from 'kafkajs';
import { startHarvestStack, crash, type HarvestStack } from '../support/harvest-stack.ts';
import { postgresUnavailable } from '../support/postgres.ts';
import { kafkaUnavailable, privateKafkaUnavailable, removeKafkaPrefix, startPrivateKafka, type PrivateKafka } from '../support/kafka.ts';
import { issueKey, json } from '../support/gateway.ts';
import { until } from '../support/until.ts';
import { harvestEvents, harvestStream, type HarvestEvent } from '../../events/harvest.ts';
import { groupFor, topicFor } from '../../src/dispatch/kafka.ts';
import { harvestWorkKind } from '../../src/harvest/types.ts';
import type { ChildProcess } from 'node:child_process';

const brokers = process.env.KAFKA_BROKERS;
const databaseUrl = process.env.DATABASE_URL;
const unavailable = (await kafkaUnavailable(brokers)) ?? (await postgresUnavailable(databaseUrl));
const privateUnavailable = unavailable ?? (await privateKafkaUnavailable());
const prefix = `svc.test.${randomBytes(4).toString('hex')}.`;
/** Every process of a test: Kafka, this run's topic and group, a dead worker out of its group after 6 s (the brokers' least by default). */
const kafkaEnv = (kafkaBrokers: string) => ({
  SVC_HARVEST_TRANSPORT: 'kafka',
  KAFKA_BROKERS: kafkaBrokers,
  SVC_KAFKA_TOPIC_PREFIX: prefix,
  SVC_KAFKA_GROUP_PREFIX: prefix,
  SVC_KAFKA_SESSION_TIMEOUT_MS: '6000',
});

const it = suite('harvests over Kafka to svc worker processes');
let stack: HarvestStack;

const submit = (url: string, key: string, body: unknown) =>
  fetch(`${url}/v1/harvest`, { method: 'POST', headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' }, body: JSON.stringify(body) });
const poll = async (url: string, key: string, id: string, wait = 5) => json(await fetch(`${url}/v1/harvest/${id}?wait=${wait}`, { headers: { authorization: `Bearer ${key}` } }));
const finished = (url: string, key: string, id: string, limitMs = 60_000) =>
  until(
    `job ${id} to end`,
    async () => {
      const job = await poll(url, key, id);
      return job.status === 'running' || job.status === 'pending' ? null : job;
    },
    limitMs,
  );
const prompts = (n: number, label: string) => Array.from({ length: n }, (_, i) => `${label} prompt ${i}`);

async function eventsOf(id: string): Promise<HarvestEvent[]> {
  const store = await stack.openStore();
  return (await store.readStream(harvestStream(id))).events.map((e) => harvestEvents.parse(e));
}
const shardsOf = (events: HarvestEvent[]) => events.filter((e) => e.type === 'HarvestShardWritten').map((e) => (e.data as { shard: number }).shard);
const claimsOf = (events: HarvestEvent[]) => events.filter((e) => e.type === 'HarvestClaimed').map((e) => e.data as { worker_id: string; next_shard: number });
const range = (n: number) => Array.from({ length: n }, (_, i) => i);
const workerOf = (workers: ChildProcess[], workerId: string) => workers.find((w) => workerId.startsWith(`worker-${w.pid}-`));

/** Every message on the harvest topic acknowledged: the group's committed offset is each partition's end. */
async function allAcknowledged(kafkaBrokers: string): Promise<boolean> {
  const admin = new Kafka({ brokers: [kafkaBrokers], logLevel: logLevel.NOTHING }).admin();
  await admin.connect();
  try {
    const topic = topicFor(prefix, harvestWorkKind);
    const ends = await admin.fetchTopicOffsets(topic);
    const [committed] = await admin.fetchOffsets({ groupId: groupFor(prefix, harvestWorkKind), topics: [topic] });
    return ends.every((end) => end.high === end.low || committed.partitions.find((p) => p.partition === end.partition)?.offset === end.high);
  } finally {
    await admin.disconnect();
  }
}

/** A submit or poll answered while the broker was down: a job, or the contract's error envelope; never a 500. */
function inEnvelope(status: number, body: any, what: string): void {
  assert.ok(status !== 500, `${what}: 500 ${JSON.stringify(body)}`);
  if (status >= 400) assert.ok(typeof body?.error?.code === 'string' && typeof body.error.message === 'string', `${what}: ${status} ${JSON.stringify(body)}`);
  else assert.ok(typeof body?.id === 'string', `${what}: ${status} ${JSON.stringify(body)}`);
}

if (!unavailable) {
  it.before(async () => {
    stack = await startHarvestStack({ name: 'harvest-kafka', postgres: databaseUrl!, env: { SVC_HARVEST_LEASE_MS: '2000', ...kafkaEnv(brokers!) } });
  });
  it.after(async () => {
    await stack?.stop();
    await removeKafkaPrefix(brokers!.split(','), prefix);
  });

  it('a gateway and two svc worker processes finish harvests over Kafka, each message acknowledged in the group', async () => {
    const gateway = await stack.serve({}, ['--no-workers']);
    const workers = [await stack.worker(), await stack.worker()];
    try {
      const key = await issueKey(gateway.url, stack.adminToken, { email: 'kafka-jobs@example.org' });
      const ids: string[] = [];
      for (const n of [3, 4, 5]) {
        const res = await submit(gateway.url, key, { model: 'ref-byte', prompts: prompts(n, `job ${n}`), shard_size: 1, batch_size: 1 });
        assert.is(res.status, 202);
        ids.push((await json(res)).id);
      }
      for (const [i, id] of ids.entries()) {
        const done = await finished(gateway.url, key, id);
        assert.is(done.status, 'succeeded', JSON.stringify(done.error));
        const events = await eventsOf(id);
        assert.is((events.find((e) => e.type === 'HarvestStarted')?.data as { transport: string }).transport, 'kafka');
        assert.equal(shardsOf(events), range(i + 3), 'each shard recorded once');
        const claims = claimsOf(events);
        assert.is(claims.length, 1, 'claimed once');
        assert.ok(workerOf(workers, claims[0].worker_id), `claimed by a worker process: ${claims[0].worker_id}`);
      }
      await until('every message acknowledged in the group', () => allAcknowledged(brokers!), 15_000, 200);
    } finally {
      for (const child of [gateway.child, ...workers]) await crash(child);
    }
  });

  it('the worker holding a job is killed: the other worker finishes it, each shard recorded once', async () => {
    const gateway = await stack.serve({}, ['--no-workers']);
    const workers = [await stack.worker(), await stack.worker()];
    try {
      const key = await issueKey(gateway.url, stack.adminToken, { email: 'kafka-kill@example.org' });
      await stack.chaos({ mode: 'delay', count: 1_000_000, delay_ms: 250 });
      const res = await submit(gateway.url, key, { model: 'ref-byte', prompts: prompts(8, 'kill'), shard_size: 1, batch_size: 1 });
      assert.is(res.status, 202);
      const id = (await json(res)).id as string;
      await until('two shards written', async () => (await poll(gateway.url, key, id)).progress.shards_done >= 2);
      const [claim] = claimsOf(await eventsOf(id));
      const holder = workerOf(workers, claim.worker_id);
      assert.ok(holder, `the claim names a worker process: ${claim.worker_id}`);
      await crash(holder!);
      await stack.chaos({ mode: 'none' });
      const done = await finished(gateway.url, key, id);
      assert.is(done.status, 'succeeded', JSON.stringify(done.error));
      const events = await eventsOf(id);
      assert.equal(shardsOf(events), range(8), 'each shard recorded once');
      const claims = claimsOf(events);
      assert.is(claims.length, 2, 'claimed once more, after the kill');
      const survivor = workers.find((w) => w !== holder)!;
      assert.ok(claims[1].worker_id.startsWith(`worker-${survivor.pid}-`), 'the surviving worker took it over');
      assert.ok(claims[1].next_shard >= 2, 'from the first shard not recorded');
    } finally {
      await stack.chaos({ mode: 'none' });
      for (const child of [gateway.child, ...workers]) await crash(child);
    }
  });
} else {
  console.log(`harvests over Kafka: the gateway and svc worker tests are SKIPPED: ${unavailable}`);
  it.skip(`gateway and svc workers over Kafka: ${unavailable}`, () => {});
}

if (!privateUnavailable) {
  it('a broker stopped for 20 s mid-harvest: the job finishes, each shard once; submits and polls meanwhile answer in the envelope; new jobs go through after', async () => {
    let broker: PrivateKafka | null = null;
    const children: ChildProcess[] = [];
    try {
      broker = await startPrivateKafka('harvest-kafka');
      const env = kafkaEnv(broker.brokers);
      const gateway = await stack.serve(env, ['--no-workers']);
      children.push(gateway.child);
      const workers = [await stack.worker(env), await stack.worker(env)];
      children.push(...workers);
      const key = await issueKey(gateway.url, stack.adminToken, { email: 'kafka-outage@example.org' });
      await stack.chaos({ mode: 'delay', count: 1_000_000, delay_ms: 1_000 });
      const res = await submit(gateway.url, key, { model: 'ref-byte', prompts: prompts(12, 'outage'), shard_size: 1, batch_size: 1 });
      assert.is(res.status, 202);
      const id = (await json(res)).id as string;
      await until('two shards written', async () => (await poll(gateway.url, key, id)).progress.shards_done >= 2);

      await broker.stop();
      // Submits (of another key: the running cap) and polls all along the outage; a submit may take the
      // client's retries to answer. The broker is down 20 s.
      const probeKey = await issueKey(gateway.url, stack.adminToken, { email: 'kafka-outage-probe@example.org' });
      const downUntil = Date.now() + 20_000;
      const submits: Array<{ status: number; id: string | null }> = [];
      const probing = (async () => {
        while (Date.now() < downUntil) {
          const submitted = await submit(gateway.url, probeKey, { model: 'ref-byte', prompts: ['while the broker is down'] });
          const body = await json(submitted);
          inEnvelope(submitted.status, body, 'a submit while the broker is down');
          submits.push({ status: submitted.status, id: body.id ?? null });
          const polled = await fetch(`${gateway.url}/v1/harvest/${id}`, { headers: { authorization: `Bearer ${key}` } });
          inEnvelope(polled.status, await json(polled), 'a poll while the broker is down');
          await new Promise((r) => setTimeout(r, 500));
        }
      })();
      // The worker holding the job works on without the broker: the job finishes while it is down (it
      // stays down until then, and 20 s at least), its acknowledgement waiting in the worker's memory.
      const done = await finished(gateway.url, key, id, 90_000);
      assert.is(done.status, 'succeeded', JSON.stringify(done.error));
      await new Promise((r) => setTimeout(r, Math.max(0, downUntil - Date.now())));
      await broker.start();
      await probing;
      await stack.chaos({ mode: 'none' });
      const outageEvents = await eventsOf(id);
      assert.equal(shardsOf(outageEvents), range(12), 'each shard recorded once');
      assert.is(claimsOf(outageEvents).length, 1, 'the worker holding the job worked on through the outage: never claimed again');
      // The transport works again: a new job is published, delivered and acknowledged.
      const after = await submit(gateway.url, key, { model: 'ref-byte', prompts: prompts(2, 'after') });
      assert.is(after.status, 202);
      const afterId = (await json(after)).id as string;
      assert.is((await finished(gateway.url, key, afterId)).status, 'succeeded');
      // Each submit during the outage was told the truth: a 503 left a job failed at its start (never
      // counted); a 202 (a resumer started the job while its publish was failing) runs once the broker is back.
      const accepted = submits.filter((s) => s.status === 202).map((s) => s.id!);
      const refused = submits.filter((s) => s.status === 503).length;
      for (const probe of accepted) assert.is((await finished(gateway.url, probeKey, probe)).status, 'succeeded');
      const listed = await until('every probe job listed', async () => {
        const list = await json(await fetch(`${gateway.url}/v1/harvest?limit=100`, { headers: { authorization: `Bearer ${probeKey}` } }));
        return list.data.length === accepted.length + refused ? (list.data as Array<{ id: string; status: string; error: { code: string } | null }>) : null;
      });
      assert.equal(listed.filter((j) => j.error?.code === 'start_failed').length, refused, JSON.stringify({ submits, listed }));
      assert.equal(listed.filter((j) => j.error?.code !== 'start_failed').map((j) => j.id).sort(), [...accepted].sort(), JSON.stringify({ submits, listed }));
      await until('every message acknowledged in the group', () => allAcknowledged(broker!.brokers), 30_000, 200);
    } finally {
      await stack.chaos({ mode: 'none' }).catch(() => {});
      for (const child of children) await crash(child);
      await broker?.wipe();
    }
  });
} else {
  console.log(`harvests over Kafka: the broker outage test is SKIPPED: ${privateUnavailable}`);
  it.skip(`a private Kafka broker stopped and started mid-harvest: ${privateUnavailable}`, () => {});
}

it.run();
