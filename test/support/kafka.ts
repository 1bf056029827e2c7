/**
 * Kafka for tests: why a cluster cannot be used, removing a run's topics and groups, and a broker of a
 * test's own (`infra/dev/services.sh` on free ports, its data in a temporary directory, the jars of the
 * shared cache) that the test may stop and start again on the same data without touching the shared one.
 */
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Kafka, logLevel } from 'kafkajs';
import { freePort } from './ports.ts';

const services = fileURLToPath(new URL('../../infra/dev/services.sh', import.meta.url));
const run = promisify(execFile);

/** Null when the brokers named answer a metadata request; else why not, for a test's skip reason. */
export async function kafkaUnavailable(brokers: string | null | undefined): Promise<string | null> {
  if (!brokers) return 'KAFKA_BROKERS is not set (e.g. 127.0.0.1:9092; infra/dev/services.sh starts one)';
  const admin = new Kafka({ brokers: brokers.split(','), logLevel: logLevel.NOTHING, retry: { retries: 1 }, connectionTimeout: 3_000 }).admin();
  try {
    await admin.connect();
    await admin.listTopics();
    return null;
  } catch (error) {
    return `Kafka at KAFKA_BROKERS cannot be reached (${(error as Error).message})`;
  } finally {
    await admin.disconnect().catch(() => {});
  }
}

/** Deletes the topics and consumer groups whose names start with `prefix` (a test run's). */
export async function removeKafkaPrefix(brokers: string[], prefix: string): Promise<void> {
  const admin = new Kafka({ brokers, clientId: 'svc-test-cleanup', logLevel: logLevel.NOTHING }).admin();
  await admin.connect();
  try {
    const topics = (await admin.listTopics()).filter((t) => t.startsWith(prefix));
    if (topics.length > 0) await admin.deleteTopics({ topics });
    const groups = (await admin.listGroups()).groups.map((g) => g.groupId).filter((g) => g.startsWith(prefix));
    if (groups.length > 0) await admin.deleteGroups(groups).catch(() => {});
  } finally {
    await admin.disconnect();
  }
}

/** Null when services.sh can run a broker here (Java, and Maven or the jars already cached); else why not. */
export async function privateKafkaUnavailable(): Promise<string | null> {
  for (const tool of ['java', 'mvn']) {
    try {
      await run('sh', ['-c', `command -v ${tool}`]);
    } catch {
      return `${tool} is not installed (infra/dev/services.sh runs Apache Kafka's jars from Maven Central)`;
    }
  }
  return null;
}

export interface PrivateKafka {
  /** `127.0.0.1:<port>`, for KAFKA_BROKERS. */
  readonly brokers: string;
  /** Stops the broker (SIGTERM, then SIGKILL after 30 s), keeping its data. */
  stop(): Promise<void>;
  /** Starts it again on its data; resolves once it creates topics. */
  start(): Promise<void>;
  /** Stops it and deletes its data. */
  wipe(): Promise<void>;
}


/** One KRaft node of this test's own, started (services.sh can take a minute or more on a busy machine). */
export async function startPrivateKafka(name: string): Promise<PrivateKafka> {
  const dataDir = mkdtempSync(join(tmpdir(), `svc-${name}-kafka-`));
  const port = await freePort();
  const env = { ...process.env, KAFKA_PORT: String(port), KAFKA_CONTROLLER_PORT: String(await freePort()), KAFKA_DATA_DIR: dataDir, KAFKA_HEAP: '384m' };
  const script = (command: string) => run(services, [command, '--no-postgres', '--no-python'], { env, timeout: 180_000 }).then(() => undefined);
  // Should the test die before its wipe, the broker (started with setsid: it outlives its shell) dies with it.
  const killLeftover = () => {
    try {
      process.kill(Number(readFileSync(join(dataDir, 'kafka.pid'), 'utf8')), 'SIGKILL');
    } catch {
      // not running
    }
    rmSync(dataDir, { recursive: true, force: true });
  };
  process.once('exit', killLeftover);
  try {
    await script('start');
  } catch (error) {
    killLeftover();
    process.off('exit', killLeftover);
    throw error;
  }
  return {
    brokers: `127.0.0.1:${port}`,
    stop: () => script('stop'),
    start: () => script('start'),
    async wipe() {
      await script('wipe').catch(() => {});
      killLeftover();
      process.off('exit', killLeftover);
    },
  };
}
