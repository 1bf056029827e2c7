/** The Kafka transport's names and admin calls: a kind's topic and group, topic creation, admin reads tried again on a momentary error. */
import { createHash } from 'node:crypto';
import type { Admin } from 'kafkajs';

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
export async function adminRead<T>(read: () => Promise<T>): Promise<T> {
  for (let attempt = 0; ; attempt++) {
    try {
      return await read();
    } catch (error) {
      if (attempt >= 4 || !momentary(error)) throw error;
      await new Promise((resolve) => setTimeout(resolve, 100 * 2 ** attempt));
    }
  }
}

/** Creates a kind's topic when missing (an existing one is left as it is), once per topic while it succeeds. */
export function topicCreator(admin: Admin, ready: () => Promise<void>, settings: { partitions: number; replicationFactor?: number }): (topic: string) => Promise<void> {
  const topics = new Map<string, Promise<void>>();
  return function ensureTopic(topic: string): Promise<void> {
    let made = topics.get(topic);
    if (!made) {
      made = ready()
        // (again on a retriable error: a fresh KRaft broker can answer UNKNOWN_TOPIC_OR_PARTITION while it waits for the leaders)
        .then(() => adminRead(() => admin.createTopics({ topics: [{ topic, numPartitions: settings.partitions, replicationFactor: settings.replicationFactor ?? -1 }], waitForLeaders: true })))
        .then(() => undefined);
      made.catch(() => topics.delete(topic));
      topics.set(topic, made);
    }
    return made;
  };
}
