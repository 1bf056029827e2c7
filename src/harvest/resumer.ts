/**
 * The resumer: a timed workflow's driver. Every tick it reads the pending and running jobs from the
 * harvest_jobs table, decides with `resumeHarvests` which have lost their worker (a claim whose lease
 * lapsed, a start that never happened), sends each `Redispatch` to its job stream and publishes the
 * job again on the transport. Every gateway and worker process runs one; the decider and the command
 * ids make a lapse handled by two of them dispatch the job once.
 *
 * It also applies the retention of failed and cancelled jobs' files: of the jobs that have a folder in
 * the harvest storage, those that ended (failed or cancelled) more than `failedRetentionMs` ago have
 * their files removed (`RemoveFiles`, reason `retention`), at most once a minute (each tick when the
 * retention is shorter than ten ticks).
 */
import { resumeHarvests } from '../../workflows/index.ts';
import { expiredHarvestJobs, resumableHarvestJobs } from '../../projections/index.ts';
import type { SqlDatabase } from '../store/index.ts';
import type { HarvestService } from './service.ts';
import type { HarvestStorage } from './storage.ts';

export interface HarvestResumerOptions {
  service: HarvestService;
  db: SqlDatabase;
  leaseMs: number;
  maxRedispatches: number;
  /** Between ticks (default: a third of the lease, at most 5 s). */
  intervalMs?: number;
  /** The retention of failed and cancelled jobs' files, and where they are; none without. */
  retention?: { storage: HarvestStorage; failedRetentionMs: number };
  logger: { warn(obj: object, msg: string): void };
  now?: () => Date;
}

export class HarvestResumer {
  readonly #options: HarvestResumerOptions;
  #timer: NodeJS.Timeout | null = null;
  #ticking: Promise<void> | null = null;
  #lastSweep = 0;

  constructor(options: HarvestResumerOptions) {
    this.#options = options;
  }

  start(): void {
    const interval = this.#options.intervalMs ?? Math.min(5_000, Math.max(50, Math.floor(this.#options.leaseMs / 3)));
    this.#timer = setInterval(() => {
      this.#ticking ??= this.tick()
        .catch((error) => this.#options.logger.warn({ err: (error as Error)?.message }, 'harvest resumer tick failed; next tick retries'))
        .finally(() => (this.#ticking = null));
    }, interval);
    this.#timer.unref();
  }

  async stop(): Promise<void> {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = null;
    await this.#ticking;
  }

  /** One tick: every job that lost its worker is dispatched again. */
  async tick(): Promise<void> {
    const { service, db, leaseMs, maxRedispatches } = this.#options;
    const now = (this.#options.now ?? (() => new Date()))();
    const jobs = await resumableHarvestJobs(db);
    for (const { stream, command, commandId } of resumeHarvests({ now: now.toISOString() }, { jobs, leaseMs, maxRedispatches })) {
      await service.redispatch(stream.slice('harvest-'.length), command.reason, commandId);
    }
    const retention = this.#options.retention;
    if (retention && now.getTime() - this.#lastSweep >= Math.min(60_000, retention.failedRetentionMs / 10)) {
      this.#lastSweep = now.getTime();
      await this.sweep(now);
    }
  }

  /** Removes the files of every job that failed or was cancelled more than the retention ago. */
  async sweep(now: Date): Promise<string[]> {
    const retention = this.#options.retention;
    if (!retention) return [];
    const expired = await expiredHarvestJobs(this.#options.db, await retention.storage.listJobs(), new Date(now.getTime() - retention.failedRetentionMs).toISOString());
    for (const jobId of expired) await this.#options.service.removeFiles(jobId, 'retention', null);
    return expired;
  }
}
