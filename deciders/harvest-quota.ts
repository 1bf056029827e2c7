/**
 * The harvest quota decider: one key's harvest admissions (stream `harvest-quota-<keyId>`;
 * events/harvest.ts). Two submits of one key race here, not on their job streams, so each is decided
 * on the state the other left: the monthly job quota and the cap on running jobs cannot be passed.
 *
 * The month's count is the jobs admitted in that UTC month minus those released uncounted (their
 * start failed: no GPU was engaged); a new month starts it at 0. A job holds a running slot from its
 * admission until its release. One rule frees a slot (`harvestSlotFreed`): the job ended on its own
 * stream (counted as it was), or its stream never appeared `harvestOrphanAdmissionMs` after the
 * admission (the submit died or failed in between: not counted). It is applied by `Release` (the
 * harvest-slots workflow, when a job ends) and by `Admit` to the key's active jobs as the submit read
 * them, so a slot never waits on the workflow's lag; whichever comes first appends the release.
 */
import { reject, type Decider, type Rejection } from '../src/event-sourcing/index.ts';
import { HarvestJobAdmitted, harvestQuotaEvents, HarvestSlotReleased, utcMonth, type HarvestQuotaEvent } from '../events/harvest.ts';
import { isHarvestTerminal, type HarvestStatus } from './harvest.ts';

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
      /** The key's active jobs as their own streams hold them (read just before): those ended are released first, in this decision. */
      jobs: readonly ObservedJob[];
    }
  | { type: 'Release'; jobId: string; counted: boolean; now: string };

export type HarvestQuotaRejection = Rejection<'harvest_quota_exceeded' | 'harvest_concurrency_exceeded'>;

/** An admitted job as its stream `harvest-<jobId>` holds it (status `none`: no event there yet). */
export interface ObservedJob {
  readonly jobId: string;
  readonly status: HarvestStatus;
  readonly counted: boolean;
}

/** An admission whose job stream is still empty this long after it is an orphan: its submit died or failed in between. */
export const harvestOrphanAdmissionMs = 60_000;

/** Whether an admitted job's slot is free at `now`, and whether it counts against its month; null while it holds it. */
export function harvestSlotFreed(admittedAt: string, job: ObservedJob, now: string): { counted: boolean } | null {
  if (isHarvestTerminal(job.status)) return { counted: job.counted };
  if (job.status === 'none' && Date.parse(now) - Date.parse(admittedAt) >= harvestOrphanAdmissionMs) return { counted: false };
  return null;
}

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
        const released: HarvestQuotaEvent[] = [];
        let next = state;
        for (const job of command.jobs) {
          const admitted = next.active.get(job.jobId);
          const freed = admitted ? harvestSlotFreed(admitted.at, job, at) : null;
          if (!freed) continue;
          const event = HarvestSlotReleased({ job_id: job.jobId, counted: freed.counted, at });
          released.push(event);
          next = harvestQuotaDecider.evolve(next, event);
        }
        // A resent admission (a retry under another command id): the slot is taken already.
        if (next.active.has(command.jobId)) return released;
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
        return [...released, HarvestJobAdmitted({ job_id: command.jobId, month, at })];
      }
      case 'Release':
        return state.active.has(command.jobId) ? HarvestSlotReleased({ job_id: command.jobId, counted: command.counted, at: command.now }) : [];
      default: {
        const unhandled: never = command;
        throw new Error(`unknown harvest quota command ${JSON.stringify(unhandled)}`);
      }
    }
  },
};
