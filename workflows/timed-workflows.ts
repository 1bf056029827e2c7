/**
 * Reactions to the passing of time: the hold reaper, the spend watcher, the harvest resumer and the
 * harvest files' retention. Each rule is a pure `decide(tick, view)`: the tick brings the time, the
 * view is what a read model says at that time (open holds past their expiry; the day's spend; the
 * unfinished jobs; the ended jobs with files), and the output is commands with ids derived from what
 * they act on. They keep no state of their own: the read models are it, and a tick that died half-way
 * is decided again from them, its commands appending nothing twice. Each is a periodic workflow
 * (periodic.ts), driven by the workflow processor in the one process holding its lease; the services
 * give each its view (`read`) and send its commands (the processor's `deliver`).
 */
import type { WorkflowCommand } from '../src/event-sourcing/index.ts';
import { spendStream, utcDay } from '../events/index.ts';
import { meterDecider, type MeterCommand } from '../deciders/meter.ts';
import { spendDecider, type SpendCommand } from '../deciders/spend.ts';
import { harvestStream } from '../events/harvest.ts';
import { harvestDecider, type HarvestCommand } from '../deciders/harvest.ts';
import { periodicWorkflow, type PeriodicWorkflow, type Tick } from './periodic.ts';

export type { Tick } from './periodic.ts';

/** An open hold as the meter_holds projection lists it. */
export interface ExpiringHold {
  readonly requestId: string;
  readonly streamId: string;
  readonly expiresAt: Date;
  /** When it was made (absent: only its expiry counts). */
  readonly reservedAt?: Date;
}

/**
 * The reaper: a hold whose request no longer runs here is sent to expiry on its own day's stream when
 * it is past its expiry, or (given `leaseTtlMs`) older than a slot lease, so that the process it was
 * made in may have stopped renewing that lease (it died). The meter decider judges either on the
 * stream: it expires a hold past its expiry, or one whose lease has lapsed, charging it whole, and
 * nothing else (a renewal moved it on, its process still renews its lease). A hold of a request still
 * running in this process is left alone: this process renews it, and its lease.
 */
export function reapHolds(
  tick: Tick,
  view: { expired: readonly ExpiringHold[]; runningHere: ReadonlySet<string>; leaseTtlMs?: number },
): WorkflowCommand<Extract<MeterCommand, { type: 'Expire' }>>[] {
  const now = Date.parse(tick.now);
  const leaseMayHaveLapsed = (hold: ExpiringHold) => view.leaseTtlMs !== undefined && hold.reservedAt !== undefined && hold.reservedAt.getTime() + view.leaseTtlMs <= now;
  return view.expired
    .filter((hold) => !view.runningHere.has(hold.requestId) && (hold.expiresAt.getTime() <= now || leaseMayHaveLapsed(hold)))
    .map((hold) => ({ stream: hold.streamId, commandId: `expire:${hold.requestId}`, command: { type: 'Expire', requestId: hold.requestId, now: tick.now } }));
}

/**
 * The spend watcher: the day's spend so far is reported to the day's spend stream, whose decider
 * reaches the cap when it is met (the threshold is its rule, not this one's). Nothing is sent with no
 * cap, or once the cap is known reached today. The command's id names the spend seen, so a report of
 * the same spend is sent once.
 */
export function watchSpend(tick: Tick, view: { spendMicros: number; capMicros: number | null; reachedDay: string | null }): WorkflowCommand<SpendCommand>[] {
  const day = utcDay(tick.now);
  const { spendMicros, capMicros } = view;
  if (capMicros === null || view.reachedDay === day) return [];
  return [{ stream: spendStream(day), commandId: `spend-check:${day}:${spendMicros}`, command: { type: 'CheckSpend', day, spendMicros, capMicros, now: tick.now } }];
}

/** A pending or running harvest job as the harvest_jobs projection lists it (`resumableHarvestJobs`). */
export interface ResumableHarvest {
  readonly jobId: string;
  readonly status: string;
  readonly leaseUntil: Date | null;
  readonly startedAt: Date | null;
  readonly submittedAt: Date;
  /** Times it was redispatched so far: names the next attempt, so one lapse gives one command id. */
  readonly redispatches: number;
  /** The last redispatch (an unclaimed job's lease runs from it); absent: from its start. */
  readonly redispatchedAt?: Date | null;
}

/**
 * The harvest resumer: a running job whose worker is gone (its claim's lease lapsed) is redispatched on
 * its own stream, one no worker claimed within a lease of its dispatch is published again, and a
 * pending job that was never started (the process that accepted it died) is started, all by
 * `Redispatch`; the harvest decider judges again on the stream's state (the view may lag) and fails a
 * job lost too often. The command's id names the lapse: the job and the attempt it would be (an
 * unclaimed job: the dispatch it follows; a pending job: its start), so every process may send it and
 * the first appends; a view that lags sends the same id again, which appends nothing.
 */
export function resumeHarvests(
  tick: Tick,
  view: { jobs: readonly ResumableHarvest[]; leaseMs: number; maxRedispatches: number },
): WorkflowCommand<Extract<HarvestCommand, { type: 'Redispatch' }>>[] {
  const now = Date.parse(tick.now);
  const { leaseMs, maxRedispatches } = view;
  const out: WorkflowCommand<Extract<HarvestCommand, { type: 'Redispatch' }>>[] = [];
  for (const job of view.jobs) {
    let reason: string;
    let commandId: string;
    if (job.status === 'pending') {
      if (job.submittedAt.getTime() + leaseMs > now) continue;
      reason = 'never started';
      commandId = `redispatch:${job.jobId}:start`;
    } else if (job.status === 'running') {
      if (job.leaseUntil !== null) {
        if (job.leaseUntil.getTime() > now) continue;
        reason = `the claim's lease lapsed at ${job.leaseUntil.toISOString()}`;
        commandId = `redispatch:${job.jobId}:${job.redispatches + 1}`;
      } else {
        const since = job.redispatchedAt ?? job.startedAt ?? job.submittedAt;
        if (since.getTime() + leaseMs > now) continue;
        reason = `no worker claimed it within ${Math.round(leaseMs / 1000)} s`;
        // Named by the dispatch it follows: published again once a lease, however often.
        commandId = `republish:${job.jobId}:${since.toISOString()}`;
      }
    } else continue;
    out.push({ stream: harvestStream(job.jobId), commandId, command: { type: 'Redispatch', now: tick.now, leaseMs, maxRedispatches, reason } });
  }
  return out;
}

/** The harvest files' retention: each ended job whose files outlived the retention (the view lists them) has them removed. */
export function retireHarvestFiles(tick: Tick, view: { expired: readonly string[] }): WorkflowCommand<Extract<HarvestCommand, { type: 'RemoveFiles' }>>[] {
  return view.expired.map((jobId) => ({
    stream: harvestStream(jobId),
    commandId: `remove-files:${jobId}`,
    command: { type: 'RemoveFiles', reason: 'retention', byKeyPrefix: null, now: tick.now },
  }));
}

type Reaped = Extract<MeterCommand, { type: 'Expire' }>;
type Resumed = Extract<HarvestCommand, { type: 'Redispatch' }>;
type Retired = Extract<HarvestCommand, { type: 'RemoveFiles' }>;

/** The reaper as a periodic workflow: every `periodMs`, the holds `read` lists are judged by `reapHolds`. */
export function holdReaperWorkflow(options: {
  periodMs: number;
  leaseTtlMs: number;
  read(tick: Tick): Promise<{ expired: readonly ExpiringHold[]; runningHere: ReadonlySet<string> }>;
}): PeriodicWorkflow<Reaped, { expired: readonly ExpiringHold[]; runningHere: ReadonlySet<string> }> {
  return periodicWorkflow<Reaped, { expired: readonly ExpiringHold[]; runningHere: ReadonlySet<string> }>({ name: 'hold-reaper', periodMs: options.periodMs, target: meterDecider, read: options.read, decide: (tick, view) => reapHolds(tick, { ...view, leaseTtlMs: options.leaseTtlMs }) });
}

type SpendView = { spendMicros: number; capMicros: number | null; reachedDay: string | null };

/** The spend watcher as a periodic workflow: every `periodMs`, the day's spend `read` gives is judged by `watchSpend`. */
export function spendWatcherWorkflow(options: { periodMs: number; read(tick: Tick): Promise<SpendView> }): PeriodicWorkflow<SpendCommand, SpendView> {
  return periodicWorkflow({ name: 'spend-watcher', periodMs: options.periodMs, target: spendDecider, read: options.read, decide: watchSpend });
}

type ResumeView = { jobs: readonly ResumableHarvest[]; leaseMs: number; maxRedispatches: number };

/** The harvest resumer as a periodic workflow: every `periodMs`, the unfinished jobs `read` lists are judged by `resumeHarvests`. */
export function harvestResumerWorkflow(options: { periodMs: number; read(tick: Tick): Promise<ResumeView> }): PeriodicWorkflow<Resumed, ResumeView> {
  return periodicWorkflow<Resumed, ResumeView>({ name: 'harvest-resumer', periodMs: options.periodMs, target: harvestDecider, read: options.read, decide: resumeHarvests });
}

/** The harvest files' retention as a periodic workflow: every `periodMs`, the expired jobs `read` lists have their files removed. */
export function harvestRetentionWorkflow(options: { periodMs: number; read(tick: Tick): Promise<{ expired: readonly string[] }> }): PeriodicWorkflow<Retired, { expired: readonly string[] }> {
  return periodicWorkflow<Retired, { expired: readonly string[] }>({ name: 'harvest-retention', periodMs: options.periodMs, target: harvestDecider, read: options.read, decide: retireHarvestFiles });
}
