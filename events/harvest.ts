/**
 * Harvests: bulk activation capture as asynchronous jobs. Two stream kinds, both in the `harvest`
 * category (a job id starts with `hj_`, so the two never collide):
 * - `harvest-<jobId>`: one job's life (submitted, started, claimed by a worker, shard by shard, ended);
 * - `harvest-quota-<keyId>`: the key's admissions, where the monthly job quota and the running-job
 *   cap are decided, so that two submits of one key racing each other are serialized here.
 * Metadata only: never a prompt (the job names its input by its sha256) nor an activation.
 */
import { defineEvent, eventCatalogue, Type, type EventOf, type Static } from '../src/event-sourcing/index.ts';
import { Instant, Month, Nullable } from './shapes.ts';

const Count = Type.Integer({ minimum: 0 });
const Sha256 = Type.String({ pattern: '^[0-9a-f]{64}$' });
/** `hj_` and lowercase letters or digits (24 of them as the service makes them). */
const JobId = Type.String({ pattern: '^hj_[0-9a-z]{1,64}$' });
/** A claim: one worker's hold on the job, a fencing token (a later claim supersedes it). */
const ClaimId = Type.String({ minLength: 1, maxLength: 128 });
/** Why a job failed: `stale`, `worker_lost`, `capture_incomplete`, ... A string, so a later release may add one. */
const FailureCode = Type.String({ minLength: 1, maxLength: 64 });
/** Free text (an error's message), cut to this length by the decider. */
export const harvestMessageMax = 2000;
const Message = Type.String({ maxLength: harvestMessageMax });

/** A job accepted (its quota slot admitted first, on the key's quota stream): `pending`. */
export const HarvestSubmitted = defineEvent(
  'HarvestSubmitted',
  Type.Object(
    {
      job_id: JobId,
      key_id: Type.String({ minLength: 1 }),
      key_prefix: Type.String({ minLength: 1 }),
      /** Jobs are visible to every key of this user. */
      user_id: Type.String({ minLength: 1 }),
      model: Type.String({ minLength: 1 }),
      /** The model's checkpoint (weights revision) the activations come from, as the registry names it. */
      checkpoint: Type.String(),
      prompt_count: Type.Integer({ minimum: 1 }),
      /** Characters / 4, as the submit check counted them. */
      estimated_tokens: Count,
      /** The layers captured, resolved (`all` and null made explicit), ascending. */
      layers: Type.Array(Type.Integer({ minimum: 0 })),
      d_model: Nullable(Type.Integer({ minimum: 1 })),
      shard_size: Type.Integer({ minimum: 1, maximum: 4096 }),
      /** Prompts per capture call, resolved. */
      batch_size: Type.Integer({ minimum: 1, maximum: 64 }),
      /** ceil(prompt_count / shard_size): shard i holds prompts i*shard_size onwards. */
      shard_count: Type.Integer({ minimum: 1 }),
      /** The stored input (the prompts, kept beside the shards, never in the log). */
      input_sha256: Sha256,
      /** The UTC month the job counts against. */
      month: Month,
      at: Instant,
    },
    { additionalProperties: false },
  ),
);

/** Its compute job was handed to a transport (or, by the resumer, to one again after its process died): `running`. */
export const HarvestStarted = defineEvent(
  'HarvestStarted',
  Type.Object({ job_id: JobId, key_id: Type.String({ minLength: 1 }), transport: Type.String({ minLength: 1, maxLength: 64 }), at: Instant }, { additionalProperties: false }),
);

/** The compute job could not be started: `failed`, and never counted against the quota (no GPU engaged). */
export const HarvestStartFailed = defineEvent(
  'HarvestStartFailed',
  Type.Object({ job_id: JobId, key_id: Type.String({ minLength: 1 }), reason: Message, at: Instant }, { additionalProperties: false }),
);

/** A worker took the job, from `next_shard` on; any earlier claim is superseded (its records are refused). */
export const HarvestClaimed = defineEvent(
  'HarvestClaimed',
  Type.Object(
    { job_id: JobId, claim_id: ClaimId, worker_id: Type.String({ minLength: 1, maxLength: 256 }), next_shard: Count, lease_until: Instant, at: Instant },
    { additionalProperties: false },
  ),
);

/** The claim's worker is alive: its lease moves on. */
export const HarvestClaimRenewed = defineEvent(
  'HarvestClaimRenewed',
  Type.Object({ job_id: JobId, claim_id: ClaimId, lease_until: Instant, at: Instant }, { additionalProperties: false }),
);

/**
 * A shard as its worker wrote it (fsynced under its name): the one shape of a shard record. The event
 * below carries it, the job's state keeps it, the worker records it (RecordShard), the manifest lists it
 * (`index` for `shard`), the harvest_shards projection and the job's view show it.
 */
export const HarvestShardFields = {
  shard: Count,
  /** Named per claim (`shard-00000-<claim suffix>.safetensors`), so a superseded worker never overwrites it. */
  file: Type.String({ minLength: 1, maxLength: 256 }),
  first_prompt: Count,
  prompt_count: Type.Integer({ minimum: 1 }),
  token_count: Count,
  bytes: Count,
  sha256: Sha256,
};
export const HarvestShard = Type.Object(HarvestShardFields, { additionalProperties: false });
export type HarvestShard = Static<typeof HarvestShard>;

/** One shard file written and fsynced, in order; recording it also renews the claim's lease. */
export const HarvestShardWritten = defineEvent(
  'HarvestShardWritten',
  Type.Object({ job_id: JobId, claim_id: ClaimId, ...HarvestShardFields, lease_until: Instant, at: Instant }, { additionalProperties: false }),
);

/** The resumer found the claim's lease lapsed (or no claim came): the claim is cleared and the job dispatched again. */
export const HarvestRedispatched = defineEvent(
  'HarvestRedispatched',
  Type.Object({ job_id: JobId, attempt: Type.Integer({ minimum: 1 }), reason: Message, at: Instant }, { additionalProperties: false }),
);

/**
 * A running job no worker has claimed within a lease of its dispatch (every worker busy, or its
 * transport lost with a process that held it in memory) is published again. Not a lost worker: the
 * job is not failed for it, however often.
 */
export const HarvestRepublished = defineEvent(
  'HarvestRepublished',
  Type.Object({ job_id: JobId, reason: Message, at: Instant }, { additionalProperties: false }),
);

/** Every shard written and the manifest after them: `succeeded`, with the totals summed from the shards. */
export const HarvestSucceeded = defineEvent(
  'HarvestSucceeded',
  Type.Object(
    {
      job_id: JobId,
      key_id: Type.String({ minLength: 1 }),
      claim_id: Nullable(ClaimId),
      manifest_sha256: Sha256,
      manifest_bytes: Count,
      shard_count: Type.Integer({ minimum: 1 }),
      prompt_count: Type.Integer({ minimum: 1 }),
      token_count: Count,
      bytes: Count,
      at: Instant,
    },
    { additionalProperties: false },
  ),
);

/** `failed`: by its worker, aged out (`stale`) or lost too often (`worker_lost`). Counted against the quota. */
export const HarvestFailed = defineEvent(
  'HarvestFailed',
  Type.Object({ job_id: JobId, key_id: Type.String({ minLength: 1 }), code: FailureCode, message: Message, at: Instant }, { additionalProperties: false }),
);

/** `cancelled` by a key of the owning user. Counted against the quota. */
export const HarvestCancelled = defineEvent(
  'HarvestCancelled',
  Type.Object({ job_id: JobId, key_id: Type.String({ minLength: 1 }), by_key_prefix: Type.String({ minLength: 1 }), at: Instant }, { additionalProperties: false }),
);

/**
 * A failed or cancelled job's files (shards, prompts) were removed from the harvest storage: by a key of
 * the owning user (`DELETE /v1/harvest/{id}` of a failed job, `by_key_prefix`), or aged out after the
 * retention (`reason` `retention`, `by_key_prefix` null). The job's record stays; its shards are no longer served.
 */
export const HarvestFilesRemoved = defineEvent(
  'HarvestFilesRemoved',
  Type.Object(
    {
      job_id: JobId,
      key_id: Type.String({ minLength: 1 }),
      reason: Type.Union([Type.Literal('owner'), Type.Literal('retention')]),
      by_key_prefix: Nullable(Type.String({ minLength: 1 })),
      at: Instant,
    },
    { additionalProperties: false },
  ),
);

export const harvestEvents = eventCatalogue('harvest', [
  HarvestSubmitted,
  HarvestStarted,
  HarvestStartFailed,
  HarvestClaimed,
  HarvestClaimRenewed,
  HarvestShardWritten,
  HarvestRedispatched,
  HarvestSucceeded,
  HarvestFailed,
  HarvestCancelled,
  HarvestFilesRemoved,
  HarvestRepublished,
]);
export type HarvestEvent =
  | EventOf<typeof HarvestSubmitted>
  | EventOf<typeof HarvestStarted>
  | EventOf<typeof HarvestStartFailed>
  | EventOf<typeof HarvestClaimed>
  | EventOf<typeof HarvestClaimRenewed>
  | EventOf<typeof HarvestShardWritten>
  | EventOf<typeof HarvestRedispatched>
  | EventOf<typeof HarvestSucceeded>
  | EventOf<typeof HarvestFailed>
  | EventOf<typeof HarvestCancelled>
  | EventOf<typeof HarvestFilesRemoved>
  | EventOf<typeof HarvestRepublished>;
export type HarvestSubmittedData = EventOf<typeof HarvestSubmitted>['data'];
export type HarvestShardWrittenData = EventOf<typeof HarvestShardWritten>['data'];

/** The events that end a job, one per job. */
export type HarvestEnded = Extract<HarvestEvent, { type: 'HarvestSucceeded' | 'HarvestFailed' | 'HarvestCancelled' | 'HarvestStartFailed' }>;

/** A job's slot taken on its key's quota stream, in the UTC month it counts against. */
export const HarvestJobAdmitted = defineEvent('HarvestJobAdmitted', Type.Object({ job_id: JobId, month: Month, at: Instant }, { additionalProperties: false }));

/**
 * The job's running slot is free. `counted` false (its start failed, or it was never recorded) also
 * gives its month's quota back. `reason`: `ended` (on its own stream), `orphan` (its stream never
 * appeared), `stale` (no progress for the stale time: the job is aged out after it); absent at version 1.
 */
export const HarvestSlotReleased = defineEvent(
  'HarvestSlotReleased',
  Type.Object(
    { job_id: JobId, counted: Type.Boolean(), reason: Type.Optional(Type.Union([Type.Literal('ended'), Type.Literal('orphan'), Type.Literal('stale')])), at: Instant },
    { additionalProperties: false },
  ),
  // Version 2 added `reason` (a release of version 1 does not say why).
  { version: 2, upcasters: { 1: (data) => data } },
);

export const harvestQuotaEvents = eventCatalogue('harvest-quota', [HarvestJobAdmitted, HarvestSlotReleased]);
export type HarvestQuotaEvent = EventOf<typeof HarvestJobAdmitted> | EventOf<typeof HarvestSlotReleased>;

export const harvestStream = (jobId: string): string => `harvest-${jobId}`;
export const harvestQuotaStream = (keyId: string): string => `harvest-quota-${keyId}`;

/** The key a `harvest-quota-<keyId>` stream belongs to; null for any other stream. */
export function harvestQuotaKeyOf(streamId: string): string | null {
  return streamId.startsWith('harvest-quota-') ? streamId.slice('harvest-quota-'.length) : null;
}

/** The job a `harvest-<jobId>` stream belongs to; null for any other stream (a quota stream included). */
export function harvestJobOf(streamId: string): string | null {
  return streamId.startsWith('harvest-hj_') ? streamId.slice('harvest-'.length) : null;
}

/** The UTC month of an instant: the month a job counts against. */
export { utcMonth } from './shapes.ts';
