/** Assignment: a partition with a handler running stays with its consumer (a kafkajs assigner). */
import { AssignerProtocol, type Assigner, type PartitionAssigner } from 'kafkajs';

/** The protocol name of the assigner: every member of a group must use it. */
export const kafkaAssignerName = 'SvcDispatchBusySticky';

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
