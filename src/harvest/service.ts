/**
 * The harvest application service: submit, read, wait, list, cancel, download. It sends commands and
 * reads; every rule is in the deciders (deciders/harvest.ts on `harvest-<jobId>`,
 * deciders/harvest-quota.ts on `harvest-quota-<keyId>`), and what happens after the submit's answer
 * is the workflows' (src/harvest/resumer.ts, workflows/): a slot released when its job ends
 * (harvest-slots) or a minute after an admission whose job was never recorded (harvest-orphans), a
 * job aged out once its admission freed its slot as stale (the submit first, harvest-age-out after a
 * crash), a start that never
 * happened, a job nobody claimed, a worker lost (the resumer's `Redispatch`). Every command on a job
 * goes through `command`, which also wakes this process's long-polls.
 */
import type { Readable } from 'node:stream';
import { apiError } from '../errors/index.ts';
import type { CommandHandler, Outcome } from '../command-handler/index.ts';
import type { SqlDatabase } from '../store/index.ts';
import type { HarvestSettings } from '../config/index.ts';
import type { ModelRegistry } from '../registry/index.ts';
import type { DispatchTransport } from '../dispatch/index.ts';
import { harvestJobOf, harvestStream, harvestQuotaStream, type HarvestEvent, type HarvestQuotaEvent } from '../../events/index.ts';
import { ageOutOf } from '../../workflows/index.ts';
import {
  harvestDecider,
  harvestDispatched,
  harvestQuotaDecider,
  isHarvestTerminal,
  type HarvestCommand,
  type HarvestQuotaCommand,
  type HarvestRejection,
  type HarvestState,
  type ObservedJob,
} from '../../deciders/index.ts';
import { listHarvestJobs } from '../../projections/index.ts';
import { HarvestStorageError, isStorageFull, type HarvestStorage } from './storage.ts';
import { LongPolls } from './long-poll.ts';
import { admissionRefused, harvestJobIdPattern, newHarvestJobId, plannedJob } from './request.ts';
import { jobView, shardView } from './view.ts';
import { harvestWorkKind, type HarvestCaller, type HarvestJobView, type HarvestRequest, type HarvestShardView } from './types.ts';

export { harvestJobIdPattern, newHarvestJobId, resolveLayers } from './request.ts';

export interface HarvestServiceOptions {
  handler: CommandHandler;
  db: SqlDatabase;
  storage: HarvestStorage;
  transport: DispatchTransport;
  registry: ModelRegistry;
  settings: HarvestSettings;
  logger: { error(obj: object, msg: string): void; warn(obj: object, msg: string): void };
  now?: () => Date;
}

export const isTerminal = (status: string): boolean => isHarvestTerminal(status as HarvestState['status']);

const jobIdShape = new RegExp(harvestJobIdPattern);

export class HarvestService {
  readonly #handler: CommandHandler;
  readonly #db: SqlDatabase;
  readonly #storage: HarvestStorage;
  readonly #transport: DispatchTransport;
  readonly #registry: ModelRegistry;
  readonly #settings: HarvestSettings;
  readonly #logger: HarvestServiceOptions['logger'];
  readonly #now: () => Date;
  readonly #polls: LongPolls;
  #unfollow: (() => void) | null = null;
  /** Workers of this process watching their jobs (a cancel reaches them at once). */
  readonly #watchers = new Map<string, Set<(state: HarvestState) => void>>();
  /** Reconciles under way, one per job: a burst of polls shares one (each serves what it found). */
  readonly #reconciling = new Map<string, Promise<HarvestState | null>>();

  constructor(options: HarvestServiceOptions) {
    this.#handler = options.handler;
    this.#db = options.db;
    this.#storage = options.storage;
    this.#transport = options.transport;
    this.#registry = options.registry;
    this.#settings = options.settings;
    this.#logger = options.logger;
    this.#now = options.now ?? (() => new Date());
    this.#polls = new LongPolls({ perKey: options.settings.longPollsPerKey, total: options.settings.longPollsTotal });
  }

  get settings(): HarvestSettings {
    return this.#settings;
  }

  /** Wakes long-polls on other processes' writes to job streams (the handler follows the log). */
  start(): void {
    this.#unfollow = this.#handler.onForeignEvent((event) => {
      const jobId = harvestJobOf(event.streamId);
      if (jobId) this.#changed(jobId);
    });
  }

  stop(): void {
    this.#unfollow?.();
    this.#polls.closeAll();
  }

  // --- submit ---------------------------------------------------------------------------------

  /**
   * A straight line of commands, what the contract's answer needs in order: the request's checks; the
   * admission on the key's quota stream (the quota decider frees the slots of the key's jobs that
   * ended or are stale, as their streams hold them); the input stored and the job recorded `pending`;
   * its compute job published; then `running` and 202. Any failure after the admission is `FailStart`
   * (recorded or not), answered 503 (`harvest_storage_full` or `harvest_unavailable`); the slot and
   * the count go back by the quota decider's rule (the harvest-slots workflow, or the key's next
   * admission that finds the failed start), never by the submit.
   */
  async submit(caller: HarvestCaller, request: HarvestRequest): Promise<HarvestJobView> {
    const now = this.#now();
    const planned = plannedJob(caller, request, { settings: this.#settings, registry: this.#registry, jobId: newHarvestJobId(), now });
    const jobId = planned.job_id;
    const admit: HarvestQuotaCommand = {
      type: 'Admit',
      jobId,
      now: now.toISOString(),
      monthlyQuota: caller.budgets.monthly_harvest_jobs,
      runningCap: this.#settings.maxRunningPerKey,
      staleAfterMs: this.#settings.staleAfterMs,
      jobs: await this.#activeJobs(caller.keyId),
    };
    const admitted = await this.#handler.handle(harvestQuotaStream(caller.keyId), admit, harvestQuotaDecider, { commandId: `admit:${jobId}`, metadata: { key_prefix: caller.prefix } });
    if (!admitted.accepted) throw admissionRefused(admitted.rejection, now);
    await this.#ageOut(admitted.newEvents);
    try {
      const input = await this.#storage.saveInput(jobId, request.prompts);
      const outcome = await this.command(jobId, { type: 'Submit', job: { ...planned, input_sha256: input.sha256 } });
      if (!outcome.accepted) throw new Error(`job ${jobId} not recorded: ${outcome.rejection.rejected}`);
      await this.#transport.publish(harvestWorkKind, jobId, { job_id: jobId });
    } catch (error) {
      return this.#startFailed(caller, jobId, error);
    }
    const started = await this.command(jobId, { type: 'Start', transport: this.#transport.name, now: this.#now().toISOString() });
    return this.#view(started.state);
  }

  /**
   * The jobs whose slots the admission freed as stale, failed on their streams before the answer (the
   * contract ages them out during the submit), as harvest-age-out would: one of them failing to is left
   * to that workflow, which sends the same command again.
   */
  async #ageOut(admitted: readonly HarvestQuotaEvent[]): Promise<void> {
    for (const event of admitted) {
      if (event.type !== 'HarvestSlotReleased') continue;
      for (const { stream, commandId, command } of ageOutOf(event.data)) {
        const jobId = harvestJobOf(stream)!;
        await this.command(jobId, command, commandId).catch((err) => this.#logger.warn({ job_id: jobId, err: (err as Error)?.message }, 'harvest age-out left to its workflow'));
      }
    }
  }

  /** The key's admitted jobs as their streams hold them, for the admission to judge. */
  async #activeJobs(keyId: string): Promise<ObservedJob[]> {
    const { state } = await this.#handler.load(harvestQuotaStream(keyId), harvestQuotaDecider, { fresh: true });
    return Promise.all([...state.active.keys()].map((jobId) => this.observed(jobId)));
  }

  /** The submit's failure after its admission: `FailStart`, answered 503 (it does not count against the quota). */
  async #startFailed(caller: HarvestCaller, jobId: string, error: unknown): Promise<HarvestJobView> {
    const reason = `the job could not be started: ${(error as Error)?.message ?? 'unknown error'}`;
    const failed = await this.command(jobId, { type: 'FailStart', jobId, keyId: caller.keyId, reason, now: this.#now().toISOString() }).catch(() => null);
    if (failed && !failed.accepted && failed.state.status !== 'pending') {
      // A publish slower than a lease: the resumer started the job meanwhile. It runs and counts: answered as started.
      this.#logger.warn({ job_id: jobId, err: (error as Error)?.message }, 'harvest job start failed here, but the resumer had started it meanwhile');
      return this.#view(failed.state);
    }
    this.#logger.error({ job_id: jobId, err: (error as Error)?.message }, 'harvest job could not be started');
    // Never recorded: no job owns its input file.
    if (failed?.state.job === null) await this.#storage.removeJob(jobId).catch(() => undefined);
    if (isStorageFull(error)) {
      throw apiError('harvest_storage_full', 'the harvest storage is full: the job was not recorded and does not count against your quota; try again once space is freed (the operators, or DELETE of failed jobs)');
    }
    throw apiError('harvest_unavailable', `the harvest could not be started; it does not count against your quota. ${reason}`);
  }

  // --- reads ----------------------------------------------------------------------------------

  /** The job as stored, for its owner or another key of the same user; anyone else gets the 404 of a job that does not exist. */
  async get(caller: HarvestCaller, jobId: string): Promise<HarvestJobView> {
    return this.#view(await this.#reconciled(jobId, await this.#owned(caller, jobId)));
  }

  /**
   * Waits up to `seconds` for the job's status or progress to change, then answers its state. Over
   * the long-poll caps it answers at once, `declined`.
   */
  async wait(caller: HarvestCaller, jobId: string, seconds: number, signal: AbortSignal): Promise<{ view: HarvestJobView; declined: boolean }> {
    let state: HarvestState = await this.#owned(caller, jobId);
    if (seconds === 0 || isTerminal(state.status)) return { view: await this.#view(await this.#reconciled(jobId, state)), declined: false };
    const seen = progressOf(state);
    const deadline = Date.now() + seconds * 1000;
    // Entered before the reconcile, so a change meanwhile wakes it; a declined one is a read all the same.
    const waiting = this.#polls.enter(caller.keyId, jobId);
    state = await this.#reconciled(jobId, state);
    if (!waiting) return { view: await this.#view(state), declined: true };
    try {
      // An outcome the reconcile recorded ends the wait at once.
      while (!signal.aborted && progressOf(state) === seen) {
        const left = deadline - Date.now();
        if (left <= 0) break;
        await waiting.next(left, signal);
        state = await this.#load(jobId, true);
      }
    } finally {
      waiting.leave();
    }
    return { view: await this.#view(state), declined: false };
  }

  /** The caller's user's jobs, newest first, from the harvest_jobs table. */
  async list(caller: HarvestCaller, options: { limit: number; before?: string | null }): Promise<HarvestJobView[]> {
    const rows = await listHarvestJobs(this.#db, { userId: caller.userId, limit: options.limit, before: options.before ?? undefined });
    const views: HarvestJobView[] = [];
    for (const row of rows) views.push(await this.#view(await this.#load(row.jobId)));
    return views;
  }

  /**
   * DELETE: a pending or running job is cancelled; a failed one has its files (shards, prompts)
   * removed, its record kept. A succeeded or cancelled job is 409.
   */
  async cancel(caller: HarvestCaller, jobId: string): Promise<HarvestJobView> {
    const state = await this.#owned(caller, jobId);
    if (state.status === 'failed') return this.#view(await this.removeFiles(jobId, 'owner', caller.prefix));
    const outcome = await this.command(jobId, { type: 'Cancel', byKeyPrefix: caller.prefix, now: this.#now().toISOString() });
    if (!outcome.accepted) {
      // Failed meanwhile (its worker, an age-out): its files go, as they would have.
      if (outcome.state.status === 'failed') return this.#view(await this.removeFiles(jobId, 'owner', caller.prefix));
      throw apiError(
        'harvest_not_cancellable',
        `job ${jobId} has ended (${outcome.state.status}); only a pending or running job can be cancelled, and only a failed job's files removed`,
      );
    }
    return this.#view(outcome.state);
  }

  /**
   * Removes a failed (or, by the retention, cancelled) job's files: recorded on its stream first, then
   * the folder removed, so a crash in between leaves files the retention removes later. Idempotent.
   */
  async removeFiles(jobId: string, reason: 'owner' | 'retention', byKeyPrefix: string | null): Promise<HarvestState> {
    const outcome = await this.command(jobId, { type: 'RemoveFiles', reason, byKeyPrefix, now: this.#now().toISOString() }, `remove-files:${jobId}`);
    if (!outcome.accepted) throw apiError('harvest_not_cancellable', `job ${jobId} is ${outcome.state.status}: only a failed job's files can be removed`);
    await this.#storage.removeJob(jobId);
    return outcome.state;
  }

  /** A recorded shard's file, streamed with its length and hash. */
  async shard(caller: HarvestCaller, jobId: string, index: number): Promise<{ stream: Readable; size: number; record: HarvestShardView }> {
    const state = await this.#owned(caller, jobId);
    const record = state.shards[index];
    if (!record || state.status === 'cancelled') throw apiError('harvest_shard_not_found', `job ${jobId} has no written shard ${index}`);
    if (state.filesRemovedAt !== null) throw apiError('harvest_shard_not_found', `the files of job ${jobId} were removed at ${state.filesRemovedAt}`);
    const opened = await this.#storage.openShard(jobId, record.file).catch((error) => {
      if (error instanceof HarvestStorageError) return null;
      throw error;
    });
    if (!opened) throw apiError('harvest_shard_not_found', `shard ${index} of job ${jobId} is no longer stored`);
    return { ...opened, record: shardView(jobId, record) };
  }

  /** A succeeded job's stats.safetensors, streamed with its length and hash (as its manifest describes it). */
  async stats(caller: HarvestCaller, jobId: string): Promise<{ stream: Readable; size: number; file: string; sha256: string }> {
    const state = await this.#owned(caller, jobId);
    const notFound = () => apiError('harvest_stats_not_found', `job ${jobId} has no statistics${state.status === 'succeeded' ? '' : ` (it is ${state.status}; they are written when it succeeds)`}`);
    if (state.status !== 'succeeded') throw notFound();
    const stats = (await this.#storage.readManifest(jobId).catch(() => null))?.manifest.stats;
    if (!stats) throw notFound();
    const opened = await this.#storage.openShard(jobId, stats.file).catch(() => null);
    if (!opened) throw notFound();
    return { ...opened, file: stats.file, sha256: stats.sha256 };
  }

  // --- commands -------------------------------------------------------------------------------

  /** Decides a command on a job's stream and waits until it is stored; wakes this process's long-polls on the job. */
  async command(jobId: string, command: HarvestCommand, commandId?: string): Promise<Outcome<HarvestState, HarvestEvent, HarvestRejection>> {
    const outcome = await this.#handler.handle(harvestStream(jobId), command, harvestDecider, commandId ? { commandId } : {});
    if (outcome.accepted && outcome.newEvents.length > 0) this.#changed(jobId);
    return outcome;
  }

  /** The job's state as stored, other processes' writes included. */
  state(jobId: string): Promise<HarvestState> {
    return this.#load(jobId, true);
  }

  /** The job as the quota decider judges it (`ObservedJob`), as stored. */
  async observed(jobId: string): Promise<ObservedJob> {
    const { status, counted, lastProgressAt } = await this.#load(jobId, true);
    return { jobId, status, counted, lastProgressAt };
  }

  /** Calls `listener` with the job's state after each change to it (this process's commands, others' seen on the log). */
  onChange(jobId: string, listener: (state: HarvestState) => void): () => void {
    const listeners = this.#watchers.get(jobId) ?? new Set();
    this.#watchers.set(jobId, listeners);
    listeners.add(listener);
    return () => {
      listeners.delete(listener);
      if (listeners.size === 0) this.#watchers.delete(jobId);
    };
  }

  #changed(jobId: string): void {
    this.#polls.changed(jobId);
    const listeners = this.#watchers.get(jobId);
    if (!listeners) return;
    void this.#load(jobId, true).then(
      (state) => listeners.forEach((listener) => listener(state)),
      () => undefined,
    );
  }

  #view(state: HarvestState): Promise<HarvestJobView> {
    return jobView(state, this.#storage);
  }

  /** The job's state as stored (`fresh`: read what other processes appended first). */
  async #load(jobId: string, fresh = false): Promise<HarvestState> {
    return (await this.#handler.load(harvestStream(jobId), harvestDecider, { fresh })).state;
  }

  async #owned(caller: HarvestCaller, jobId: string): Promise<HarvestState & { job: NonNullable<HarvestState['job']> }> {
    const notFound = () => apiError('harvest_job_not_found', `no harvest job ${jobId}`);
    if (!jobIdShape.test(jobId)) throw notFound();
    const state = await this.#load(jobId, true);
    const job = state.job;
    if (!job || (job.key_id !== caller.keyId && job.user_id !== caller.userId)) throw notFound();
    return state as HarvestState & { job: NonNullable<HarvestState["job"]> };
  }

  /**
   * One non-blocking look at a running job's compute: a manifest written whole whose success was never
   * recorded (the worker died in between) is recorded now (`Succeed`, the one command a read sends).
   * Every read of a running job makes one (a burst of reads shares it) and serves what it found: the
   * terminal state it recorded, else the state read (also when it failed, which is logged, never a
   * 500). A job whose worker is gone is the resumer's to dispatch again, not a read's.
   */
  async #reconciled(jobId: string, state: HarvestState): Promise<HarvestState> {
    if (state.status !== 'running') return state;
    let underway = this.#reconciling.get(jobId);
    if (!underway) {
      underway = this.#reconcileOnce(jobId, state)
        .catch((error) => {
          this.#logger.warn({ job_id: jobId, err: (error as Error)?.message }, 'harvest reconcile failed; serving the stored state');
          return null;
        })
        .finally(() => this.#reconciling.delete(jobId));
      this.#reconciling.set(jobId, underway);
    }
    return (await underway) ?? state;
  }

  /** The terminal state an outcome found now was recorded as (its update applies only to a running job), or null. */
  async #reconcileOnce(jobId: string, state: HarvestState): Promise<HarvestState | null> {
    if (state.shards.length < state.job!.shard_count) return null;
    const manifest = await this.#storage.readManifest(jobId);
    if (!manifest) return null;
    const outcome = await this.command(jobId, { type: 'Succeed', claimId: null, manifestSha256: manifest.sha256, manifestBytes: manifest.bytes, now: this.#now().toISOString() });
    // Refused because the job ended otherwise meanwhile (cancelled, say), that end is what is served.
    return isTerminal(outcome.state.status) ? outcome.state : null;
  }

  /**
   * The resumer's `Redispatch` of a job (the one path that dispatches a job again): the decider starts
   * a job never started, publishes again one nobody claimed, redispatches one whose worker is gone or
   * fails it; the job is published when that appended a dispatch. True when it was.
   */
  async redispatch(jobId: string, reason: string, commandId?: string): Promise<boolean> {
    const { leaseMs, maxRedispatches } = this.#settings;
    const outcome = await this.command(jobId, { type: 'Redispatch', now: this.#now().toISOString(), leaseMs, maxRedispatches, reason }, commandId);
    if (!outcome.accepted || !harvestDispatched(outcome.newEvents)) return false;
    await this.#transport.publish(harvestWorkKind, jobId, { job_id: jobId });
    return true;
  }
}

/** What a long-poll waits to change: the status and how many shards are written. */
const progressOf = (state: HarvestState): string => `${state.status}:${state.shards.length}`;
