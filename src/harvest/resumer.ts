/**
 * The harvests' workflows that go through the harvest service, as the workflow processor drives them
 * in the one process holding each one's lease; this module gives them their views and sends their
 * commands through the service (which wakes the job's long-polls and its worker):
 * - the resumer (periodic): every tick it reads the pending and running jobs from the harvest_jobs
 *   table, `resumeHarvests` decides which have lost their worker (a claim whose lease lapsed, a start
 *   that never happened), and each `Redispatch` goes to its job stream, the job published again on
 *   the transport when it was decided (`HarvestService.redispatch`);
 * - the age-out: a job whose slot its key's admission released as stale is aged out on its stream;
 * - the orphan check: a minute after each admission, its job as its stream holds it is given to the
 *   quota decider (`Release`), which frees the slot of one never recorded;
 * - the retention of failed and cancelled jobs' files: of the jobs that have a folder in the harvest
 *   storage, those that ended more than `failedRetentionMs` ago have their files removed
 *   (`RemoveFiles`, reason `retention`), once a minute (or ten times per retention when shorter, at most once per resumer tick).
 */
import { harvestAgeOutWorkflow, harvestOrphansWorkflow, harvestResumerWorkflow, harvestRetentionWorkflow } from '../../workflows/index.ts';
import { expiredHarvestJobs, resumableHarvestJobs } from '../../projections/index.ts';
import type { Queryable } from '../store/index.ts';
import type { ServiceWorkflows } from '../processors/index.ts';
import type { HarvestService } from './service.ts';
import type { HarvestStorage } from './storage.ts';

export interface HarvestTimersOptions {
  service: Pick<HarvestService, 'redispatch' | 'removeFiles' | 'command' | 'observed'>;
  db: Queryable;
  leaseMs: number;
  maxRedispatches: number;
  /** Between the resumer's ticks (default: a third of the lease, at most 5 s). */
  intervalMs?: number;
  /** The retention of failed and cancelled jobs' files, and where they are; none without. */
  retention?: { storage: HarvestStorage; failedRetentionMs: number };
}

const jobOf = (stream: string): string => stream.slice('harvest-'.length);

export function harvestTimers(options: HarvestTimersOptions): ServiceWorkflows {
  const { service, db, leaseMs, maxRedispatches, retention } = options;
  const resumerMs = options.intervalMs ?? Math.min(5_000, Math.max(50, Math.floor(leaseMs / 3)));
  const resumer = harvestResumerWorkflow({
    periodMs: resumerMs,
    read: async () => ({ jobs: await resumableHarvestJobs(db), leaseMs, maxRedispatches }),
  });
  const orphans = harvestOrphansWorkflow({ read: (jobId) => service.observed(jobId) });
  const deliver: Record<string, ServiceWorkflows['deliver'][string]> = {
    [resumer.name]: async ({ stream, command, commandId }) => void (await service.redispatch(jobOf(stream), command.reason, commandId)),
    [harvestAgeOutWorkflow.name]: async ({ stream, command, commandId }) => void (await service.command(jobOf(stream), command, commandId)),
  };
  const lifecycle = [resumer, harvestAgeOutWorkflow, orphans];
  if (!retention) return { workflows: lifecycle, deliver };
  const retire = harvestRetentionWorkflow({
    periodMs: Math.min(60_000, Math.max(resumerMs, Math.floor(retention.failedRetentionMs / 10))),
    read: async (tick) => ({
      expired: await expiredHarvestJobs(db, await retention.storage.listJobs(), new Date(Date.parse(tick.now) - retention.failedRetentionMs).toISOString()),
    }),
  });
  deliver[retire.name] = async ({ stream }) => void (await service.removeFiles(jobOf(stream), 'retention', null));
  return { workflows: [...lifecycle, retire], deliver };
}
