/**
 * The harvest decider: one job's life (stream `harvest-<jobId>`; events/harvest.ts).
 *
 * (none) --Submit--> pending --Start--> running --Succeed--> succeeded
 *                       |                  |
 *                       +--FailStart--> failed (not counted)      Fail, AgeOut, Redispatch (worker_lost) --> failed
 *                       +--Cancel, Fail, AgeOut------------------> cancelled / failed
 * (none) --FailStart--> failed (not counted: the submit failed before its job was recorded)
 *
 * A failed job's files can then be removed (RemoveFiles: by its owner, or by the retention, which also
 * removes a cancelled job's); the status stays. `AgeOut` ends a job whose slot its key's admission
 * freed as stale (`harvestStale`, judged there; sent by the harvest-age-out workflow), so no job runs
 * without its slot.
 *
 * While running, a worker claims the job (a fencing token: a later claim supersedes it, and the
 * superseded worker's records are refused), renews its lease, and records shards one by one in
 * plan order. `Redispatch` (the resumer's) starts a job whose start never happened, publishes again one
 * no worker claimed within a lease, redispatches one whose claim's lease lapsed (its worker died), and
 * fails it once its worker was lost too many times in a row without a shard written; the job is
 * published on its transport exactly when it appends one of those (`harvestDispatched`). A terminal state is final: whatever races it (a poll, a worker, the resumer) is
 * refused or appends nothing, so it is never overwritten. Time, ids and limits come in on the
 * commands.
 */
import { later } from '../events/shapes.ts';
import { reject, type Decider, type Rejection } from '../src/event-sourcing/index.ts';
import {
  HarvestCancelled,
  HarvestClaimed,
  HarvestClaimRenewed,
  harvestEvents,
  HarvestFailed,
  HarvestFilesRemoved,
  harvestMessageMax,
  HarvestRedispatched,
  HarvestRepublished,
  HarvestShardWritten,
  HarvestStarted,
  HarvestStartFailed,
  HarvestSubmitted,
  HarvestSucceeded,
  type HarvestEvent,
  type HarvestShardWrittenData,
  type HarvestSubmittedData,
  type HarvestShard,
} from '../events/harvest.ts';

export type HarvestStatus = 'none' | 'pending' | 'running' | 'succeeded' | 'failed' | 'cancelled';
export const harvestTerminal: readonly HarvestStatus[] = ['succeeded', 'failed', 'cancelled'];
export const isHarvestTerminal = (status: HarvestStatus): boolean => harvestTerminal.includes(status);

/** A written shard as the job's state holds it (the event's data without the lease). */
export type ShardRecord = Omit<HarvestShardWrittenData, 'job_id' | 'lease_until'>;

export interface HarvestClaim {
  readonly id: string;
  readonly workerId: string;
  readonly leaseUntil: string;
}

export interface HarvestState {
  readonly status: HarvestStatus;
  readonly job: HarvestSubmittedData | null;
  readonly startedAt: string | null;
  readonly claim: HarvestClaim | null;
  /** Index = shard number: always the plan's first `shards.length` shards. */
  readonly shards: readonly ShardRecord[];
  /** The latest of submitted, started and shard written (claims and renewals are not progress). */
  readonly lastProgressAt: string | null;
  readonly redispatches: number;
  /** Redispatches since the last shard was written: a worker lost this many times in a row fails the job. */
  readonly lostInARow: number;
  /** The last redispatch (the resumer publishes an unclaimed job again a lease after it, or after its start). */
  readonly redispatchedAt: string | null;
  readonly finishedAt: string | null;
  readonly error: { readonly code: string; readonly message: string } | null;
  /** Whether the job counts against its month's quota: every job but one whose start failed. */
  readonly counted: boolean;
  /** When a failed or cancelled job's files were removed (by its owner, or aged out); null while they are kept. */
  readonly filesRemovedAt: string | null;
}

type Now = { now: string };

export type HarvestCommand =
  | { type: 'Submit'; job: HarvestSubmittedData }
  | ({ type: 'Start'; transport: string } & Now)
  | ({ type: 'FailStart'; jobId: string; keyId: string; reason: string } & Now)
  | ({ type: 'Claim'; claimId: string; workerId: string; leaseMs: number } & Now)
  | ({ type: 'RenewClaim'; claimId: string; leaseMs: number } & Now)
  | ({ type: 'RecordShard'; claimId: string; leaseMs: number; record: HarvestShard } & Now)
  | ({ type: 'Succeed'; claimId: string | null; manifestSha256: string; manifestBytes: number } & Now)
  | ({ type: 'Fail'; code: string; message: string; claimId: string | null } & Now)
  | ({ type: 'Cancel'; byKeyPrefix: string } & Now)
  | ({ type: 'RemoveFiles'; reason: 'owner' | 'retention'; byKeyPrefix: string | null } & Now)
  | ({ type: 'AgeOut' } & Now)
  | ({ type: 'Redispatch'; leaseMs: number; maxRedispatches: number; reason: string } & Now);

export type HarvestRejection = Rejection<
  'job_exists' | 'job_finished' | 'not_pending' | 'not_started' | 'claim_superseded' | 'shard_out_of_order' | 'shards_missing' | 'not_cancellable' | 'files_kept' | 'no_such_job'
>;

const initialState: HarvestState = {
  status: 'none',
  job: null,
  startedAt: null,
  claim: null,
  shards: [],
  lastProgressAt: null,
  redispatches: 0,
  lostInARow: 0,
  redispatchedAt: null,
  finishedAt: null,
  error: null,
  counted: false,
  filesRemovedAt: null,
};

const elapsed = (from: string, to: string): number => Date.parse(to) - Date.parse(from);
const latest = (a: string | null, b: string): string => (a !== null && Date.parse(a) > Date.parse(b) ? a : b);
const cut = (text: string): string => (text.length > harvestMessageMax ? text.slice(0, harvestMessageMax) : text);

/** Shard `shard` of the job's plan: its first prompt and how many prompts it holds. */
export function plannedShard(job: Pick<HarvestSubmittedData, 'shard_size' | 'prompt_count'>, shard: number): { firstPrompt: number; promptCount: number } {
  const firstPrompt = shard * job.shard_size;
  return { firstPrompt, promptCount: Math.min(job.shard_size, job.prompt_count - firstPrompt) };
}

/**
 * Whether a running job's worker is gone at `now`: its claim's lease lapsed. An unclaimed job is
 * waiting in its transport (every worker busy, or none running): no worker was lost; `Redispatch`
 * publishes it again a lease after its dispatch (HarvestRepublished), which a transport that holds it
 * already ignores.
 */
export function harvestLeaseLapsed(state: HarvestState, now: string): boolean {
  if (state.status !== 'running') return false;
  return state.claim !== null && Date.parse(now) >= Date.parse(state.claim.leaseUntil);
}

/**
 * Whether a job is stale at `now`: pending or running with no progress (submitted, started, a shard
 * written; claims and renewals are not progress) for `staleAfterMs`. The key's next admission frees
 * a stale job's slot (deciders/harvest-quota.ts) and the job is then aged out (`AgeOut`).
 */
export function harvestStale(job: { readonly status: HarvestStatus; readonly lastProgressAt: string | null }, now: string, staleAfterMs: number): boolean {
  if (job.status !== 'pending' && job.status !== 'running') return false;
  return job.lastProgressAt !== null && elapsed(job.lastProgressAt, now) >= staleAfterMs;
}

/** Whether events a command appended dispatch the job (to be published on its transport): a start, a redispatch, a republish. */
export const harvestDispatched = (events: readonly HarvestEvent[]): boolean =>
  events.some((e) => e.type === 'HarvestStarted' || e.type === 'HarvestRedispatched' || e.type === 'HarvestRepublished');

const finished = (state: HarvestState): HarvestRejection =>
  reject('job_finished', `the harvest job has already ${state.status === 'cancelled' ? 'been cancelled' : state.status}`, { status: state.status });
const superseded = (state: HarvestState, claimId: string): HarvestRejection =>
  reject('claim_superseded', 'another worker has claimed the job since', { claim_id: claimId, current_claim_id: state.claim?.id ?? null });

export const harvestDecider: Decider<HarvestState, HarvestCommand, HarvestEvent, HarvestRejection> = {
  events: harvestEvents,
  initialState: () => initialState,
  evolve(state, event) {
    switch (event.type) {
      case 'HarvestSubmitted':
        return { ...initialState, status: 'pending', job: event.data, lastProgressAt: event.data.at, counted: true };
      case 'HarvestStarted':
        return { ...state, status: 'running', startedAt: event.data.at, lastProgressAt: latest(state.lastProgressAt, event.data.at) };
      case 'HarvestStartFailed':
        return { ...state, status: 'failed', finishedAt: event.data.at, error: { code: 'start_failed', message: event.data.reason }, counted: false, claim: null };
      case 'HarvestClaimed':
        return { ...state, claim: { id: event.data.claim_id, workerId: event.data.worker_id, leaseUntil: event.data.lease_until } };
      case 'HarvestClaimRenewed':
        return state.claim?.id === event.data.claim_id ? { ...state, claim: { ...state.claim, leaseUntil: event.data.lease_until } } : state;
      case 'HarvestShardWritten': {
        const { job_id: _job, lease_until: leaseUntil, ...shard } = event.data;
        const claim = state.claim?.id === event.data.claim_id ? { ...state.claim, leaseUntil } : state.claim;
        return { ...state, shards: [...state.shards, shard], claim, lastProgressAt: latest(state.lastProgressAt, event.data.at), lostInARow: 0 };
      }
      case 'HarvestRedispatched':
        return { ...state, claim: null, redispatches: event.data.attempt, redispatchedAt: event.data.at, lostInARow: state.lostInARow + 1 };
      case 'HarvestRepublished':
        return { ...state, redispatchedAt: event.data.at };
      case 'HarvestSucceeded':
        return { ...state, status: 'succeeded', finishedAt: event.data.at, claim: null };
      case 'HarvestFailed':
        return { ...state, status: 'failed', finishedAt: event.data.at, error: { code: event.data.code, message: event.data.message }, claim: null };
      case 'HarvestCancelled':
        return { ...state, status: 'cancelled', finishedAt: event.data.at, claim: null };
      case 'HarvestFilesRemoved':
        return { ...state, filesRemovedAt: state.filesRemovedAt ?? event.data.at };
      default: {
        const unhandled: never = event;
        throw new Error(`unknown harvest event ${JSON.stringify(unhandled)}`);
      }
    }
  },
  decide(command, state) {
    if (command.type === 'Submit') {
      if (state.status !== 'none') return reject('job_exists', 'a harvest job with this id exists already', { job_id: command.job.job_id });
      const { job } = command;
      // A plan the shards cannot follow is a caller's bug: RecordShard's order check relies on it.
      if (job.shard_count !== Math.ceil(job.prompt_count / job.shard_size)) throw new RangeError(`shard_count ${job.shard_count} is not ceil(${job.prompt_count} / ${job.shard_size})`);
      return HarvestSubmitted(job);
    }
    // A submit that failed before its job was recorded: the job is recorded as never started (its slot and count go back).
    if (command.type === 'FailStart' && state.status === 'none') return HarvestStartFailed({ job_id: command.jobId, key_id: command.keyId, reason: cut(command.reason), at: command.now });
    const job = state.job;
    if (state.status === 'none' || job === null) return reject('no_such_job', 'no harvest job has this id');
    const { job_id, key_id } = job;
    const at = command.now;
    const terminal = isHarvestTerminal(state.status);
    switch (command.type) {
      case 'Start':
        if (terminal) return finished(state);
        if (state.status === 'running') return [];
        return HarvestStarted({ job_id, key_id, transport: command.transport, at });
      case 'FailStart':
        if (terminal) return finished(state);
        if (state.status !== 'pending') return reject('not_pending', 'the harvest job has started already');
        return HarvestStartFailed({ job_id, key_id, reason: cut(command.reason), at });
      case 'Claim':
        if (terminal) return finished(state);
        if (state.status === 'pending') return reject('not_started', 'the harvest job has not started');
        if (state.claim?.id === command.claimId) return [];
        return HarvestClaimed({ job_id, claim_id: command.claimId, worker_id: command.workerId, next_shard: state.shards.length, lease_until: later(at, command.leaseMs), at });
      case 'RenewClaim':
        if (terminal) return finished(state);
        if (state.status === 'pending') return reject('not_started', 'the harvest job has not started');
        if (state.claim?.id !== command.claimId) return superseded(state, command.claimId);
        return HarvestClaimRenewed({ job_id, claim_id: command.claimId, lease_until: later(at, command.leaseMs), at });
      case 'RecordShard': {
        const { record } = command;
        // The very record made before (a lost acknowledgement, sent again): nothing more to do, whatever happened since.
        const recorded = state.shards[record.shard];
        if (recorded && recorded.sha256 === record.sha256 && recorded.file === record.file) return [];
        if (terminal) return finished(state);
        if (state.status === 'pending') return reject('not_started', 'the harvest job has not started');
        if (state.claim?.id !== command.claimId) return superseded(state, command.claimId);
        const expected = state.shards.length;
        const planned = expected < job.shard_count ? plannedShard(job, expected) : null;
        if (record.shard !== expected || planned === null || record.first_prompt !== planned.firstPrompt || record.prompt_count !== planned.promptCount) {
          return reject('shard_out_of_order', `shard ${record.shard} (prompts ${record.first_prompt}+${record.prompt_count}) is not the next in the plan`, {
            expected_shard: planned ? expected : null,
            expected_first_prompt: planned?.firstPrompt ?? null,
            expected_prompt_count: planned?.promptCount ?? null,
          });
        }
        return HarvestShardWritten({ job_id, claim_id: command.claimId, ...record, lease_until: later(at, command.leaseMs), at });
      }
      case 'Succeed': {
        if (state.status === 'succeeded') return [];
        if (terminal) return finished(state);
        if (state.status === 'pending') return reject('not_started', 'the harvest job has not started');
        if (command.claimId !== null && state.claim?.id !== command.claimId) return superseded(state, command.claimId);
        if (state.shards.length < job.shard_count) return reject('shards_missing', `${state.shards.length} of ${job.shard_count} shards are recorded`, { recorded: state.shards.length, expected: job.shard_count });
        const sum = (field: 'prompt_count' | 'token_count' | 'bytes') => state.shards.reduce((total, shard) => total + shard[field], 0);
        return HarvestSucceeded({
          job_id,
          key_id,
          claim_id: command.claimId,
          manifest_sha256: command.manifestSha256,
          manifest_bytes: command.manifestBytes,
          shard_count: state.shards.length,
          prompt_count: sum('prompt_count'),
          token_count: sum('token_count'),
          bytes: sum('bytes'),
          at,
        });
      }
      case 'Fail':
        if (state.status === 'failed') return [];
        if (terminal) return finished(state);
        if (command.claimId !== null && state.claim?.id !== command.claimId) return superseded(state, command.claimId);
        return HarvestFailed({ job_id, key_id, code: command.code, message: cut(command.message), at });
      case 'Cancel':
        if (terminal) return reject('not_cancellable', `the harvest job has already ${state.status === 'cancelled' ? 'been cancelled' : state.status}`, { status: state.status });
        return HarvestCancelled({ job_id, key_id, by_key_prefix: command.byKeyPrefix, at });
      case 'RemoveFiles':
        // A failed job's files only by its owner; a failed or cancelled job's by the retention. Once is enough.
        if (state.filesRemovedAt !== null) return [];
        if (state.status !== 'failed' && !(command.reason === 'retention' && state.status === 'cancelled')) {
          return reject('files_kept', `the harvest job is ${state.status}: only a failed job's files can be removed`, { status: state.status });
        }
        return HarvestFilesRemoved({ job_id, key_id, reason: command.reason, by_key_prefix: command.byKeyPrefix, at });
      case 'AgeOut': {
        // Its key's admission found it stale (`harvestStale`) and freed its slot: it ends, whatever came since.
        if (terminal) return [];
        const idle = Math.max(0, elapsed(state.lastProgressAt ?? job.at, at));
        return HarvestFailed({ job_id, key_id, code: 'stale', message: `no progress for ${Math.floor(idle / 60_000)} minutes; aged out`, at });
      }
      case 'Redispatch':
        if (state.status === 'pending') {
          // Submitted but never started: the process that was to start it died in between.
          return elapsed(job.at, at) >= command.leaseMs ? HarvestStarted({ job_id, key_id, transport: 'resumer', at }) : [];
        }
        if (state.status === 'running' && state.claim === null) {
          // Unclaimed a lease after its dispatch: published again (a transport that holds it ignores that).
          return elapsed(state.redispatchedAt ?? state.startedAt ?? job.at, at) >= command.leaseMs ? HarvestRepublished({ job_id, reason: cut(command.reason), at }) : [];
        }
        if (!harvestLeaseLapsed(state, at)) return [];
        if (state.lostInARow >= command.maxRedispatches) {
          return HarvestFailed({
            job_id,
            key_id,
            code: 'worker_lost',
            message: `its worker was lost ${state.lostInARow + 1} time${state.lostInARow === 0 ? '' : 's'} in a row without writing a shard (the job may crash its worker: a prompt too large for the engine's memory?); submit it again, or with a smaller batch_size`,
            at,
          });
        }
        return HarvestRedispatched({ job_id, attempt: state.redispatches + 1, reason: cut(command.reason), at });
      default: {
        const unhandled: never = command;
        throw new Error(`unknown harvest command ${JSON.stringify(unhandled)}`);
      }
    }
  },
};
