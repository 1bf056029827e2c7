/**
 * The harvest worker: a consumer of the dispatch transport's `harvest` messages. For a job it claims
 * the job on its stream (a fencing token: a later claim supersedes it, and a superseded worker can no
 * longer record a shard), renews the claim while it works, captures the prompts from the model's
 * engine in metered batches behind the backend's breaker, writes the shards through the data plane
 * (shard-pipeline.ts), records each shard, writes the manifest last and only then records success.
 * A worker that dies leaves a lapsed claim: the resumer dispatches the job again, and the next worker
 * resumes from the first shard not recorded.
 */
import { randomUUID } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { ApiError, apiError } from '../errors/index.ts';
import type { HarvestSettings } from '../config/index.ts';
import type { ModelRegistry } from '../registry/index.ts';
import type { EngineClient } from '../engine-client/index.ts';
import type { BackendService } from '../backends/index.ts';
import type { Platform } from '../platforms/index.ts';
import type { Metering, MeteredKey, Reservation } from '../metering/index.ts';
import type { KeyBudgetValues, KeyView } from '../keys/index.ts';
import { prepareValidCompletion, type CompletionContext, type CompletionRequest } from '../completion-request/index.ts';
import { encodeTexts } from '../tokenizer/index.ts';
import type { DispatchConsumer, DispatchMessage, DispatchTransport } from '../dispatch/index.ts';
import { chargeMicros, toMicros } from '../../deciders/billing.ts';
import type { HarvestState } from '../../deciders/index.ts';
import type { RequestFactsData } from '../../events/index.ts';
import type { HarvestService } from './service.ts';
import { isTerminal } from './service.ts';
import { claimTag, isStorageFull, shardFileName, type HarvestStorage } from './storage.ts';
import { CaptureBuffers, CaptureReader, type CapturedPrompt } from './capture-decode.ts';
import { captureOffsets, runShardPipeline, type BatchPlace } from './shard-pipeline.ts';
import { buildManifest } from './manifest.ts';
import { resumeStats, writeStatsFile } from './stats.ts';
import { harvestWorkKind } from './types.ts';

export interface HarvestWorkerOptions {
  service: HarvestService;
  storage: HarvestStorage;
  transport: DispatchTransport;
  registry: ModelRegistry;
  engines: EngineClient;
  context: CompletionContext;
  settings: HarvestSettings;
  platformOf?: (modelId: string) => Platform | undefined;
  backends?: BackendService;
  /** Harvest tokens are metered on the job's key like completions (null: metering is off). */
  metering?: { meter: Metering; key(prefix: string): Promise<KeyView | null> } | null;
  logger: { info(obj: object, msg: string): void; warn(obj: object, msg: string): void; error(obj: object, msg: string): void };
  workerId?: string;
}

/** Attempts per prompt when the engine fails in a way a retry can fix. */
const captureAttempts = 4;
/** Longest wait for an open breaker or a rate limit before the next attempt. */
const longestRetryWaitMs = 60_000;
/** Refusals whose Retry-After is the time they end (the breaker's cooldown, the rate window), not a generic hint. */
const exactWaits = new Set(['circuit_open', 'rate_limited', 'queue_full']);
/** The budgets of a key no longer found (it is refused as revoked whatever they say). */
const unlimited: KeyBudgetValues = { monthly_token_budget: null, daily_token_budget: null, monthly_input_token_budget: null, monthly_output_token_budget: null, monthly_harvest_jobs: null };
const retryable = new Set(['upstream_unreachable', 'upstream_server_error', 'engine_oom', 'engine_engine_dead', 'wrapper_saturated', 'circuit_open', 'platform_cold_boot', 'capture_incomplete', 'rate_limited', 'queue_full']);

/** The job's claim was superseded, or the job ended (cancelled): stop quietly, the message is done. */
class StopWork extends Error {
  override name = 'StopWork';
}

/** A failure the job is recorded failed with (a code and a message the user can act on). */
class JobFailure extends Error {
  override name = 'JobFailure';
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

export class HarvestWorker {
  readonly #options: HarvestWorkerOptions;
  readonly #workerId: string;
  #consumer: DispatchConsumer | null = null;

  constructor(options: HarvestWorkerOptions) {
    this.#options = options;
    this.#workerId = options.workerId ?? `worker-${process.pid}-${randomUUID().slice(0, 8)}`;
  }

  start(): void {
    this.#consumer = this.#options.transport.consume(harvestWorkKind, (message, signal) => this.#handle(message, signal), { concurrency: this.#options.settings.workers });
  }

  async stop(): Promise<void> {
    await this.#consumer?.stop();
  }

  async #handle(message: DispatchMessage, signal: AbortSignal): Promise<void> {
    const jobId = message.key;
    const { service, settings, logger } = this.#options;
    const claimId = randomUUID();
    const now = () => new Date().toISOString();
    const claimed = await service.command(jobId, { type: 'Claim', claimId, workerId: this.#workerId, leaseMs: settings.leaseMs, now: now() });
    if (!claimed.accepted) {
      // Published before its start was recorded (the submit records it right after): try again shortly.
      if (claimed.rejection.rejected === 'not_started') throw new Error(`job ${jobId} is not started yet`);
      return; // ended, or no such job: nothing to do
    }
    const stop = new AbortController();
    const abort = (reason: unknown) => stop.abort(reason);
    signal.addEventListener('abort', () => abort(signal.reason), { once: true });
    // Renewals keep the claim; one refused (superseded, or the job was cancelled) stops the work.
    const renewal = setInterval(() => {
      void service
        .command(jobId, { type: 'RenewClaim', claimId, leaseMs: settings.leaseMs, now: now() })
        .then((outcome) => {
          if (!outcome.accepted) abort(new StopWork(outcome.rejection.message));
        })
        .catch((error) => logger.warn({ job_id: jobId, err: (error as Error)?.message }, 'harvest claim renewal failed; retrying'));
    }, Math.max(50, Math.floor(settings.leaseMs / 3)));
    // A cancel in this process reaches the work at once; one elsewhere, at the next renewal.
    const unwatch = service.onChange(jobId, (state) => {
      if (isTerminal(state.status) || (state.claim && state.claim.id !== claimId)) abort(new StopWork('the job ended or was claimed by another worker'));
    });
    try {
      await this.#work(jobId, claimId, claimed.state, stop.signal);
    } catch (error) {
      if (signal.aborted && !(stop.signal.reason instanceof StopWork)) throw error; // shutting down: redelivered
      if (error instanceof StopWork || stop.signal.reason instanceof StopWork) return;
      const failure =
        error instanceof JobFailure
          ? error
          : isStorageFull(error)
            ? new JobFailure(
                'harvest_storage_full',
                `the harvest storage is full: the job stopped after ${(await service.state(jobId).catch(() => null))?.shards.length ?? 0} shard(s), which stay downloadable. ` +
                  `DELETE /v1/harvest/${jobId} removes this job's files (failed jobs' files are removed after the retention anyway); submit it again once space is freed`,
              )
            : new JobFailure('internal_error', `the harvest stopped on an internal error (${(error as Error)?.message ?? 'unknown'}); submit it again`);
      logger.warn({ job_id: jobId, code: failure.code }, 'harvest job failed');
      const failed = await service.command(jobId, { type: 'Fail', code: failure.code, message: failure.message, claimId, now: now() });
      // Tidied only once it has ended here: another worker may be writing the job (this claim was superseded).
      if (failed.accepted && isTerminal(failed.state.status)) await this.#options.storage.tidy(jobId, failed.state.shards.map((s) => s.file)).catch(() => undefined);
    } finally {
      clearInterval(renewal);
      unwatch();
    }
  }

  async #work(jobId: string, claimId: string, state: HarvestState, signal: AbortSignal): Promise<void> {
    const { service, storage, settings, registry } = this.#options;
    const job = state.job!;
    const model = registry.get(job.model);
    if (!model) throw new JobFailure('model_not_found', `model ${job.model} is no longer configured`);
    let prompts: string[];
    try {
      prompts = await storage.loadInput(jobId);
    } catch {
      throw new JobFailure('input_missing', "the job's prompts are no longer stored (its data directory was cleared?); submit it again");
    }
    const tokenizer = await registry.whenTokenizerReady(model.id);
    const release = this.#options.platformOf?.(model.id)?.hold();
    // Decoded captures land in reused buffers (two batches' worth and one): about half the CPU per GB of fresh ones.
    const buffers = new CaptureBuffers({ keep: 2 * job.batch_size + 1 });
    try {
      const ran = await runShardPipeline(
        {
          jobId,
          checkpoint: job.checkpoint,
          layers: job.layers,
          dModel: job.d_model,
          shardSize: job.shard_size,
          batchSize: job.batch_size,
          promptCount: job.prompt_count,
          startShard: state.shards.length,
        },
        {
          storage,
          signal,
          buffers,
          stats: await resumeStats(storage, jobId, state.shards, job.layers),
          fileNameFor: (shard) => shardFileName(shard, claimId),
          // A batch's prompts are tokenized in the tokenizer pool when they are long (off the event loop).
          captureBatch: async (first, count, batchSignal, place) =>
            this.#captureBatch(job, claimId, first, await encodeTexts(this.#options.context.tokenizers, model.tokenizer, tokenizer, prompts.slice(first, first + count), true), batchSignal, buffers, place),
          onShardWritten: async (record) => {
            const outcome = await service.command(jobId, { type: 'RecordShard', claimId, leaseMs: settings.leaseMs, record, now: new Date().toISOString() });
            if (!outcome.accepted) throw new StopWork(outcome.rejection.message);
          },
        },
      );
      const done = await service.state(jobId);
      const stats = (await writeStatsFile(storage, jobId, ran.stats)) ?? undefined;
      const manifest = buildManifest(done, { dModel: ran.dModel, stats });
      const written = await storage.writeManifest(jobId, manifest);
      const outcome = await service.command(jobId, { type: 'Succeed', claimId, manifestSha256: written.sha256, manifestBytes: written.bytes, now: new Date().toISOString() });
      if (!outcome.accepted) throw new StopWork(outcome.rejection.message);
      await storage.tidy(jobId, done.shards.map((s) => s.file)).catch(() => undefined);
      this.#options.logger.info({ job_id: jobId, shards: done.shards.length }, 'harvest job succeeded');
    } finally {
      release?.();
    }
  }

  /**
   * One batch: its tokens reserved on the key, its prompts captured at once, the reservation settled
   * with what was captured. The request id names the claim (batchRequestId): a claim that resumes the
   * job after its worker died reserves its batches anew and never meets the dead worker's holds or
   * queue entries under the same id (the reaper expires those once that process's slot lease lapses).
   */
  async #captureBatch(job: NonNullable<HarvestState['job']>, claimId: string, first: number, tokens: number[][], signal: AbortSignal, buffers: CaptureBuffers, place?: BatchPlace): Promise<CapturedPrompt[]> {
    const metering = this.#options.metering;
    const inputTokens = tokens.reduce((n, t) => n + t.length, 0);
    const facts: RequestFactsData = {
      request_id: batchRequestId(job.job_id, claimId, first),
      key_prefix: job.key_prefix,
      email: '',
      client_ip: null,
      endpoint: '/v1/harvest',
      model: job.model,
      user: null,
      workload: 'batch',
    };
    let reservation: Reservation | null = null;
    if (metering) {
      const caps = this.#options.registry.get(job.model)!.capabilities;
      const seen = await metering.key(job.key_prefix);
      facts.email = seen?.email ?? '';
      // The reservation re-check reads the key as it is now: a key revoked meanwhile fails the job.
      const key = async (): Promise<MeteredKey> => {
        const now = await metering.key(job.key_prefix);
        return now ? { keyId: now.keyId, status: now.status, budgets: now.budgets } : { keyId: job.key_id, status: 'revoked', budgets: seen?.budgets ?? unlimited };
      };
      reservation = await this.#retrying(first, signal, async () => {
        const admission = await metering.meter.admit({
          key,
          keyId: job.key_id,
          facts,
          inputTokens,
          maxTokens: 1,
          maxTokensRequested: 1,
          choices: tokens.length,
          limits: { maxActive: caps.max_inflight_per_key, maxQueued: caps.max_queued_per_key, perMinute: caps.rate_limit_per_minute },
          signal,
        });
        return admission.durable;
      });
    }
    const started = performance.now();
    const captured: CapturedPrompt[] = [];
    let status = 200;
    try {
      // each decoded where its file offset is in a 4 KiB block, so its blocks are written from it directly
      const offsets = place === undefined ? [] : captureOffsets(place, tokens.map((ids) => ids.length));
      const results = await Promise.allSettled(tokens.map((ids, i) => this.#retrying(first + i, signal, () => this.#captureOne(job, ids, signal, buffers, offsets[i]))));
      for (const result of results) {
        if (result.status === 'fulfilled') captured.push(result.value);
      }
      const failed = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (failed) {
        status = failed.reason instanceof ApiError ? failed.reason.status : 500;
        throw failed.reason;
      }
      return captured;
    } finally {
      if (metering && reservation) {
        const model = this.#options.registry.get(job.model)!;
        const seconds = (performance.now() - started) / 1000;
        const price = toMicros(model.cost_per_second);
        void metering.meter.settle(reservation, facts, {
          inputTokens: captured.reduce((n, c) => n + c.tokens.length, 0),
          outputTokens: captured.length,
          status,
          latencyMs: seconds * 1000,
          gpuSeconds: seconds,
          costMicros: chargeMicros(seconds, price),
          pricePerGpuSecondMicros: price,
          basis: captured.length > 0 ? 'engine_usage' : 'not_run',
          disconnected: false,
        });
      }
    }
  }

  /** One prompt's capture: its token ids sent as the prompt (so the shard's ids are exactly what was captured). */
  async #captureOne(job: NonNullable<HarvestState['job']>, ids: number[], signal: AbortSignal, buffers: CaptureBuffers, offset?: number): Promise<CapturedPrompt> {
    const { engines, backends, context } = this.#options;
    const request = { model: job.model, prompt: ids, max_tokens: 1, temperature: 0, output_residual_stream: job.layers } as unknown as CompletionRequest;
    const prepared = prepareValidCompletion(request, context);
    const boot = this.#options.platformOf?.(job.model)?.ensureRunning();
    if (boot) {
      // A cold engine's boot is waited out; one that stalls or fails is an engine failure like any other (retried).
      await boot.ready.catch((error: Error) => {
        throw apiError('platform_cold_boot', `the engine did not boot: ${error.message}`);
      });
    }
    const admitted = backends?.admit(job.model);
    const call = admitted instanceof Promise ? await admitted : admitted;
    // A capture that outlasts the request window is given up (the breaker counts it, as for a completion).
    const window = AbortSignal.timeout(context.requestWindowMs);
    const bounded = AbortSignal.any([signal, window]);
    // Decoded as it arrives (no chunk kept); a body that is not a capture is refused once the engine has answered.
    let reader: CaptureReader | null = null;
    let refused: unknown = null;
    try {
      await engines.postStreaming(job.model, '/v1/completions', JSON.stringify(prepared.engineBody), bounded, {
        head: (length) => {
          (reader as CaptureReader | null)?.discard();
          reader = new CaptureReader({ layers: job.layers.length, dModel: job.d_model }, buffers, length, offset);
        },
        chunk: (piece) => {
          try {
            reader!.push(piece);
            return true;
          } catch (err) {
            refused = err;
            return false;
          }
        },
      });
      call?.succeeded();
    } catch (caught) {
      (reader as CaptureReader | null)?.discard();
      const error = window.aborted && !signal.aborted ? apiError('upstream_deadline', `the engine did not answer within ${Math.round(context.requestWindowMs / 1000)} s`) : caught;
      if (!signal.aborted) call?.failed(error);
      throw error;
    }
    if (refused !== null) throw refused;
    const decoded = (reader as CaptureReader | null)!.end();
    if (decoded.shape[1] !== ids.length) {
      buffers.give(decoded.bytes);
      throw apiError('capture_incomplete', `the engine captured ${decoded.shape[1]} positions of a ${ids.length}-token prompt`);
    }
    return { tokens: Int32Array.from(ids), shape: decoded.shape, bytes: decoded.bytes };
  }

  /** Runs `attempt` until it succeeds, retrying what a retry can fix (waiting out an open breaker), within bounds. */
  async #retrying<T>(prompt: number, signal: AbortSignal, attempt: () => Promise<T>): Promise<T> {
    for (let n = 1; ; n++) {
      try {
        return await attempt();
      } catch (error) {
        if (signal.aborted) throw signal.reason instanceof Error ? signal.reason : error;
        if (error instanceof JobFailure || error instanceof StopWork) throw error;
        const apiErr = error instanceof ApiError ? error : null;
        const code = apiErr?.code ?? 'internal_error';
        if (!apiErr || !retryable.has(code)) {
          throw new JobFailure(code, `prompt ${prompt}: ${apiErr?.message ?? (error as Error)?.message ?? 'failed'}`);
        }
        if (n >= captureAttempts) {
          throw new JobFailure(code, `prompt ${prompt}: ${apiErr.message} (after ${n} attempts); the engine is failing, submit the job again later`);
        }
        // An open breaker and a rate limit say when to come back; an engine failure is tried again soon, then later.
        const retryAfter = exactWaits.has(code) ? Number(apiErr.headers['retry-after']) : NaN;
        const waitMs = Math.min(longestRetryWaitMs, Number.isFinite(retryAfter) && retryAfter > 0 ? retryAfter * 1000 : 250 * 2 ** n);
        await sleep(waitMs, signal);
      }
    }
  }
}

/** A batch's request id on the key's meter: `<jobId>:<first prompt>@<claim>`, the claim as its shard files name it (storage.ts, shardFileName). */
export function batchRequestId(jobId: string, claimId: string, first: number): string {
  return `${jobId}:${first}@${claimTag(claimId)}`;
}

function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms);
    function done() {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    }
    signal.addEventListener('abort', done, { once: true });
  });
}
