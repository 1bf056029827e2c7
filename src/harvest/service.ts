/**
 * The harvest application service: submit, read, wait, list, cancel, download. Every rule is in the
 * deciders (deciders/harvest.ts on `harvest-<jobId>`, deciders/harvest-quota.ts on
 * `harvest-quota-<keyId>`); this loads, decides, appends and maps a rejection to the API's error.
 * Every command on a job goes through `command`, which also wakes this process's long-polls.
 */
import { randomBytes } from 'node:crypto';
import type { Readable } from 'node:stream';
import { apiError, type ApiError } from '../errors/index.ts';
import type { CommandHandler, Outcome } from '../command-handler/index.ts';
import type { SqlDatabase } from '../store/index.ts';
import type { HarvestSettings } from '../config/index.ts';
import type { ModelRegistry } from '../registry/index.ts';
import type { DispatchTransport } from '../dispatch/index.ts';
import { harvestStream, harvestQuotaStream, type HarvestEvent, type HarvestQuotaEvent } from '../../events/index.ts';
import { secondsUntilUtcTurn, utcMonth } from '../../events/shapes.ts';
import { harvestDecider, harvestQuotaDecider, type HarvestCommand, type HarvestRejection, type HarvestState } from '../../deciders/index.ts';
import { listHarvestJobs } from '../../projections/index.ts';
import { HarvestStorageError, isStorageFull, type HarvestStorage } from './storage.ts';
import { LongPolls } from './long-poll.ts';
import { estimateTokens } from './estimate.ts';
import { harvestWorkKind, type HarvestCaller, type HarvestJobView, type HarvestRequest, type HarvestShardView, type HarvestStatus } from './types.ts';

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

const terminal: ReadonlySet<string> = new Set(['succeeded', 'failed', 'cancelled']);
export const isTerminal = (status: string): boolean => terminal.has(status);

/** An admission on the key's stream whose job stream never appeared (its process died in between) is released after this long. */
const orphanAdmissionMs = 60_000;

export const newHarvestJobId = (): string => `hj_${randomBytes(15).toString('hex').slice(0, 24)}`;

/** Where a harvest job's id may come from: what `newHarvestJobId` makes (anything else is a 404, never a store read). */
export const harvestJobIdPattern = '^hj_[0-9a-z]{24}$';
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
      const jobId = jobIdOfStream(event.streamId);
      if (jobId) this.#changed(jobId);
    });
  }

  stop(): void {
    this.#unfollow?.();
    this.#polls.closeAll();
  }

  // --- submit ---------------------------------------------------------------------------------

  async submit(caller: HarvestCaller, request: HarvestRequest): Promise<HarvestJobView> {
    const settings = this.#settings;
    if (request.prompts.length > settings.maxPrompts) {
      throw invalid('prompts', `prompts: ${request.prompts.length} prompts exceed the cap of ${settings.maxPrompts} per job`);
    }
    const estimatedTokens = estimateTokens(request.prompts);
    if (estimatedTokens > settings.maxEstimatedTokens) {
      throw invalid('prompts', `prompts: about ${estimatedTokens} tokens (characters / 4) exceed the cap of ${settings.maxEstimatedTokens} per job`);
    }
    const model = this.#registry.resolve(request.model);
    const activations = model.activations;
    if (!activations) throw apiError('activations_unsupported', `model ${model.id} has no activation engine: it cannot be harvested`, { fields: { param: 'model' } });
    const layers = resolveLayers(request.layers ?? null, activations.n_layers);
    const shardSize = request.shard_size ?? 32;
    const batchSize = request.batch_size ?? settings.defaultBatchSize;

    const now = this.#now();
    const jobId = newHarvestJobId();
    const ended = await this.#endedJobs(caller.keyId, now);
    const quota = caller.budgets.monthly_harvest_jobs;
    const admitted = await this.#handler.handle(
      harvestQuotaStream(caller.keyId),
      { type: 'Admit', jobId, now: now.toISOString(), monthlyQuota: quota === 0 ? null : quota, runningCap: settings.maxRunningPerKey, ended },
      harvestQuotaDecider,
      { commandId: `admit:${jobId}`, metadata: { key_prefix: caller.prefix } },
    );
    if (!admitted.accepted) throw admissionRefused(admitted.rejection, now);

    let submitted = false;
    try {
      const input = await this.#storage.saveInput(jobId, request.prompts);
      const outcome = await this.command(jobId, {
        type: 'Submit',
        job: {
          job_id: jobId,
          key_id: caller.keyId,
          key_prefix: caller.prefix,
          user_id: caller.userId,
          model: model.id,
          checkpoint: model.checkpoint,
          prompt_count: request.prompts.length,
          estimated_tokens: estimatedTokens,
          layers,
          d_model: activations.d_model ?? model.architecture?.d_model ?? null,
          shard_size: shardSize,
          batch_size: batchSize,
          shard_count: Math.ceil(request.prompts.length / shardSize),
          input_sha256: input.sha256,
          month: utcMonth(now),
          at: now.toISOString(),
        },
      });
      if (!outcome.accepted) throw new Error(`job ${jobId} not recorded: ${outcome.rejection.rejected}`);
      submitted = true;
      // The compute job starts once the pending row is committed: a transport that refuses fails the job (never counted).
      await this.#transport.publish(harvestWorkKind, jobId, { job_id: jobId });
    } catch (error) {
      const reason = `the job could not be ${submitted ? 'started' : 'recorded'}: ${(error as Error)?.message ?? 'unknown error'}`;
      if (submitted) {
        const failed = await this.command(jobId, { type: 'FailStart', reason, now: this.#now().toISOString() }).catch(() => null);
        if (failed && !failed.accepted && failed.state.status !== 'pending' && failed.state.status !== 'none') {
          // A publish slower than the lease: a resumer took the job for one whose process died and started it
          // (it publishes it until a worker claims it). It runs and counts, so it is answered as started.
          this.#logger.warn({ job_id: jobId, err: (error as Error)?.message }, 'harvest job start failed here, but a resumer had started it meanwhile');
          return this.#view(failed.state);
        }
      }
      this.#logger.error({ job_id: jobId, err: (error as Error)?.message }, submitted ? 'harvest job could not be started' : 'harvest job could not be recorded');
      if (!submitted) {
        await this.#handler
          .handle(harvestQuotaStream(caller.keyId), { type: 'Release', jobId, counted: false, now: this.#now().toISOString() }, harvestQuotaDecider, { commandId: `release:${jobId}` })
          .catch(() => undefined);
        await this.#storage.removeJob(jobId).catch(() => undefined);
      }
      if (isStorageFull(error)) {
        throw apiError('harvest_storage_full', 'the harvest storage is full: the job was not recorded and does not count against your quota; try again once space is freed (the operators, or DELETE of failed jobs)');
      }
      throw apiError('harvest_unavailable', `the harvest could not be started; it does not count against your quota. ${reason}`);
    }
    const started = await this.command(jobId, { type: 'Start', transport: this.#transport.name, now: this.#now().toISOString() });
    return this.#view(started.state);
  }

  /**
   * The key's admitted jobs that have ended, or that are stale and aged out now, or whose job stream
   * never appeared: released in the same decision as the next admission, so a finished job frees its
   * slot at once even before the harvest-slots workflow has reacted.
   */
  async #endedJobs(keyId: string, now: Date): Promise<{ jobId: string; counted: boolean }[]> {
    const { state } = await this.#handler.load(harvestQuotaStream(keyId), harvestQuotaDecider, { fresh: true });
    const ended: { jobId: string; counted: boolean }[] = [];
    for (const [jobId, admitted] of state.active) {
      const job = await this.#load(jobId, true);
      if (job.status === 'none') {
        if (now.getTime() - Date.parse(admitted.at) >= orphanAdmissionMs) ended.push({ jobId, counted: false });
        continue;
      }
      if (isTerminal(job.status)) {
        ended.push({ jobId, counted: job.counted });
        continue;
      }
      const aged = await this.command(jobId, { type: 'AgeOut', now: now.toISOString(), staleAfterMs: this.#settings.staleAfterMs });
      if (aged.accepted && isTerminal((aged.state as HarvestState).status)) ended.push({ jobId, counted: (aged.state as HarvestState).counted });
    }
    return ended;
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
   * recorded (the worker died in between) is recorded now; a claim whose lease lapsed is dispatched
   * again. Every read of a pending or running job makes one (a burst of reads shares it) and serves
   * what it found: the terminal state it recorded, else the state read (also when it failed, which is
   * logged, never a 500). It does not wait for the compute, only looks at it.
   */
  async #reconciled(jobId: string, state: HarvestState): Promise<HarvestState> {
    if (state.status !== 'running' && state.status !== 'pending') return state;
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
    const job = state.job;
    if (!job || state.status !== 'running') return null;
    if (state.shards.length === job.shard_count) {
      const manifest = await this.#storage.readManifest(jobId);
      if (manifest) {
        const outcome = await this.command(jobId, { type: 'Succeed', claimId: null, manifestSha256: manifest.sha256, manifestBytes: manifest.bytes, now: this.#now().toISOString() });
        // Refused because the job ended otherwise meanwhile (cancelled, say), that end is what is served.
        return isTerminal(outcome.state.status) ? outcome.state : null;
      }
    }
    await this.redispatch(jobId, 'a poll found its worker gone');
    return null;
  }

  /**
   * Dispatches a job again when its worker is gone (its claim's lease lapsed, or its start never
   * happened): `Redispatch` decides, and the job is published again when it did. True when it was.
   */
  async redispatch(jobId: string, reason: string, commandId?: string): Promise<boolean> {
    const settings = this.#settings;
    const state = await this.#load(jobId, true);
    // Unclaimed: waiting in the transport, or lost with a process whose transport was its memory. Publishing
    // again is harmless (a transport that holds the job ignores it), and no event is needed.
    if (state.status === 'running' && state.claim === null) return this.#transport.publish(harvestWorkKind, jobId, { job_id: jobId });
    const command: HarvestCommand = { type: 'Redispatch', now: this.#now().toISOString(), leaseMs: settings.leaseMs, maxRedispatches: settings.maxRedispatches, reason };
    const outcome = await this.command(jobId, command, commandId);
    const appended = outcome.accepted ? outcome.newEvents.map((e) => e.type) : [];
    if (!appended.includes('HarvestRedispatched') && !appended.includes('HarvestStarted')) return false;
    await this.#transport.publish(harvestWorkKind, jobId, { job_id: jobId });
    return true;
  }

  // --- views ----------------------------------------------------------------------------------

  async #view(state: HarvestState): Promise<HarvestJobView> {
    const job = state.job!;
    const shards = state.shards.map((record) => shardView(job.job_id, record));
    let result: HarvestJobView['result'] = null;
    if (state.status === 'succeeded') {
      const manifest = await this.#storage.readManifest(job.job_id).catch(() => null);
      const stats = manifest?.manifest.stats;
      result = {
        manifest: manifest?.manifest ?? null,
        manifest_sha256: manifest?.sha256 ?? '',
        shards,
        stats: stats ? { url: `/v1/harvest/${job.job_id}/stats`, file: stats.file, bytes: stats.bytes, sha256: stats.sha256 } : null,
      };
    }
    return {
      id: job.job_id,
      job_id: job.job_id,
      object: 'harvest.job',
      status: state.status as HarvestStatus,
      model: job.model,
      checkpoint: job.checkpoint,
      layers: job.layers,
      shard_size: job.shard_size,
      batch_size: job.batch_size,
      created_at: job.at,
      started_at: state.startedAt,
      finished_at: state.finishedAt,
      progress: {
        shards_done: shards.length,
        shards_total: job.shard_count,
        prompts_done: shards.reduce((n, s) => n + s.prompt_count, 0),
        prompts_total: job.prompt_count,
        tokens_done: shards.reduce((n, s) => n + s.token_count, 0),
        bytes_done: shards.reduce((n, s) => n + s.bytes, 0),
      },
      error: state.error,
      files_removed_at: state.filesRemovedAt,
      result,
    };
  }
}

type ShardRecord = HarvestState['shards'][number];

function shardView(jobId: string, record: ShardRecord): HarvestShardView {
  return {
    index: record.shard,
    url: `/v1/harvest/${jobId}/shards/${record.shard}`,
    file: record.file,
    first_prompt: record.first_prompt,
    prompt_count: record.prompt_count,
    token_count: record.token_count,
    bytes: record.bytes,
    sha256: record.sha256,
  };
}

/** What a long-poll waits to change: the status and how many shards are written. */
const progressOf = (state: HarvestState): string => `${state.status}:${state.shards.length}`;

const jobIdOfStream = (streamId: string): string | null => (streamId.startsWith('harvest-hj_') ? streamId.slice('harvest-'.length) : null);

function invalid(param: string, message: string): ApiError {
  return apiError('invalid_request', message, { fields: { param } });
}

/** `layers`: a list (ascending, distinct, each below the model's layer count when known), or every layer for `"all"` and null. */
export function resolveLayers(layers: number[] | 'all' | null, nLayers: number | null): number[] {
  if (layers === null || layers === 'all') {
    if (nLayers === null) throw invalid('layers', `layers: the model's layer count is not configured, so "all" cannot be resolved; list the layers`);
    return Array.from({ length: nLayers }, (_, i) => i);
  }
  if (layers.length === 0) throw invalid('layers', 'layers: must list at least one layer (or be "all" or null)');
  const sorted = [...new Set(layers)].sort((a, b) => a - b);
  const beyond = nLayers === null ? undefined : sorted.find((l) => l >= nLayers);
  if (beyond !== undefined) throw invalid('layers', `layers: layer ${beyond} is out of range; the model has ${nLayers} layers (0-${nLayers! - 1})`);
  return sorted;
}

function admissionRefused(rejection: { rejected: string; message: string; details?: Record<string, unknown> }, now: Date): ApiError {
  if (rejection.rejected === 'harvest_quota_exceeded') {
    return apiError('harvest_quota_exceeded', rejection.message, { retryAfter: secondsUntilUtcTurn(now.getTime(), 'month'), fields: rejection.details });
  }
  if (rejection.rejected === 'harvest_concurrency_exceeded') return apiError('harvest_concurrency_exceeded', rejection.message, { fields: rejection.details });
  return apiError('internal_error', 'the harvest admission was refused unexpectedly');
}
