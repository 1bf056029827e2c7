/**
 * The harvest quota decider: one key's harvest admissions (stream `harvest-quota-<keyId>`;
 * events/harvest.ts). Two submits of one key race here, not on their job streams, so each is decided
 * on the state the other left: the monthly job quota and the cap on running jobs cannot be passed.
 *
 * The month's count is the jobs admitted in that UTC month minus those released uncounted (their
 * start failed, or they were never recorded: no GPU was engaged); a new month starts it at 0. A job
 * holds a running slot from its admission until its release. One rule frees a slot
 * (`harvestSlotFreed`): the job ended on its own stream (counted as it was); it is stale at an
 * admission (`harvestStale`: counted; the job is then aged out on its stream by the harvest-age-out
 * workflow); or its stream never appeared `harvestOrphanAdmissionMs` after the admission (the submit
 * died in between: not counted). Every release goes through it: `Release` (the harvest-slots workflow
 * when a job ends, the harvest-orphans workflow's check a minute after each admission) and `Admit`,
 * on the key's jobs as the submit read them, so that the running cap counts only jobs still running
 * however far the workflows lag; whichever comes first appends the release, the others nothing.
 */
import { reject, type Decider, type Rejection } from '../src/event-sourcing/index.ts';
import { HarvestJobAdmitted, harvestQuotaEvents, HarvestSlotReleased, utcMonth, type HarvestQuotaEvent } from '../events/harvest.ts';
import { harvestStale, isHarvestTerminal, type HarvestStatus } from './harvest.ts';

export interface HarvestQuotaState {
  /** Jobs holding a running slot, with the month they were admitted in. */
  readonly active: ReadonlyMap<string, { readonly month: string; readonly at: string }>;
  /** The month `counted` is of (the latest admission's); null before any. */
  readonly month: string | null;
  /** Jobs admitted in `month`, minus those of them released uncounted. */
  readonly counted: number;
}

export type HarvestQuotaCommand =
  | {
      type: 'Admit';
      jobId: string;
      now: string;
      /** Jobs a month; null or 0: unlimited. */
      monthlyQuota: number | null;
      /** Jobs admitted and not yet released, at most; 0 or less: no cap. */
      runningCap: number;
      /** A pending or running job without progress this long is stale: its slot is freed. */
      staleAfterMs: number;
      /** The key's active jobs as their own streams hold them (read just before): those freed are released first, in this decision. */
      jobs: readonly ObservedJob[];
    }
  /** The job as its stream holds it: its slot is released if `harvestSlotFreed` says so (stale jobs are judged by `Admit` only). */
  | { type: 'Release'; job: ObservedJob; now: string };

export type HarvestQuotaRejection = Rejection<'harvest_quota_exceeded' | 'harvest_concurrency_exceeded'>;

/** An admitted job as its stream `harvest-<jobId>` holds it (status `none`: no event there yet). */
export interface ObservedJob {
  readonly jobId: string;
  readonly status: HarvestStatus;
  readonly counted: boolean;
  /** Its last progress (submitted, started, a shard written); null when unknown. */
  readonly lastProgressAt: string | null;
}

/** An admission whose job stream is still empty this long after it is an orphan: its submit died or failed in between. */
export const harvestOrphanAdmissionMs = 60_000;

export type HarvestSlotFreed = { readonly counted: boolean; readonly reason: 'ended' | 'orphan' | 'stale' };

/**
 * Whether an admitted job's slot is free at `now`, whether it counts against its month and why; null
 * while it holds it. `staleAfterMs` (an admission's): a stale job's slot is free too.
 */
export function harvestSlotFreed(admittedAt: string, job: ObservedJob, now: string, staleAfterMs?: number): HarvestSlotFreed | null {
  if (isHarvestTerminal(job.status)) return { counted: job.counted, reason: 'ended' };
  if (job.status === 'none') return Date.parse(now) - Date.parse(admittedAt) >= harvestOrphanAdmissionMs ? { counted: false, reason: 'orphan' } : null;
  if (staleAfterMs !== undefined && harvestStale(job, now, staleAfterMs)) return { counted: job.counted, reason: 'stale' };
  return null;
}

const released = (state: HarvestQuotaState, job: ObservedJob, now: string, staleAfterMs?: number): HarvestQuotaEvent | null => {
  const admitted = state.active.get(job.jobId);
  const freed = admitted ? harvestSlotFreed(admitted.at, job, now, staleAfterMs) : null;
  return freed ? HarvestSlotReleased({ job_id: job.jobId, counted: freed.counted, reason: freed.reason, at: now }) : null;
};

const initialState: HarvestQuotaState = { active: new Map(), month: null, counted: 0 };

/** Jobs counted against `month` (0 when the state's count is of an earlier month). */
export const harvestJobsCounted = (state: HarvestQuotaState, month: string): number => (state.month === month ? state.counted : 0);

export const harvestQuotaDecider: Decider<HarvestQuotaState, HarvestQuotaCommand, HarvestQuotaEvent, HarvestQuotaRejection> = {
  events: harvestQuotaEvents,
  initialState: () => initialState,
  evolve(state, event) {
    switch (event.type) {
      case 'HarvestJobAdmitted': {
        const active = new Map(state.active).set(event.data.job_id, { month: event.data.month, at: event.data.at });
        return { active, month: event.data.month, counted: harvestJobsCounted(state, event.data.month) + 1 };
      }
      case 'HarvestSlotReleased': {
        const admitted = state.active.get(event.data.job_id);
        if (!admitted) return state;
        const active = new Map(state.active);
        active.delete(event.data.job_id);
        // An uncounted job gives back its own month's count only (a month already over stays as it was).
        const giveBack = !event.data.counted && admitted.month === state.month ? 1 : 0;
        return { ...state, active, counted: state.counted - giveBack };
      }
      default: {
        const unhandled: never = event;
        throw new Error(`unknown harvest quota event ${JSON.stringify(unhandled)}`);
      }
    }
  },
  decide(command, state) {
    switch (command.type) {
      case 'Admit': {
        const at = command.now;
        const releases: HarvestQuotaEvent[] = [];
        let next = state;
        for (const job of command.jobs) {
          const event = released(next, job, at, command.staleAfterMs);
          if (!event) continue;
          releases.push(event);
          next = harvestQuotaDecider.evolve(next, event);
        }
        // A resent admission (a retry under another command id): the slot is taken already.
        if (next.active.has(command.jobId)) return releases;
        const month = utcMonth(at);
        const used = harvestJobsCounted(next, month);
        const quota = command.monthlyQuota;
        if (quota !== null && quota > 0 && used >= quota) {
          return reject('harvest_quota_exceeded', `this key has used its ${quota} harvest jobs for ${month}`, { quota, used, month });
        }
        const cap = command.runningCap;
        if (cap > 0 && next.active.size >= cap) {
          return reject('harvest_concurrency_exceeded', `this key has ${next.active.size} harvest jobs running (at most ${cap})`, { cap, running: next.active.size });
        }
        return [...releases, HarvestJobAdmitted({ job_id: command.jobId, month, at })];
      }
      case 'Release':
        return released(state, command.job, command.now) ?? [];
      default: {
        const unhandled: never = command;
        throw new Error(`unknown harvest quota command ${JSON.stringify(unhandled)}`);
      }
    }
  },
};
