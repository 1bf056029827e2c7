// A request to a cold model waits out the boot inside itself (the contract's Model warmth). A boot the
// platform has not acknowledged in time is 503 platform_cold_boot. One that takes longer than a short
// grace commits the response to 200 and keeps the connection alive with bytes a client ignores
// (whitespace before a JSON body, SSE comments before the first frame); what follows is the engine's
// body, or on a failure a top-level `error` object (an error frame and `data: [DONE]` on a stream).
import type { Readable } from 'node:stream';
import type { FastifyReply } from 'fastify';
import { apiError, ApiError } from '../errors/index.ts';
import { BootStalled, type Boot, type Platform } from '../platforms/index.ts';
import type { EngineResponse } from '../engine-client/index.ts';
import { checkCapture, type CheckedCapture } from './capture-relay.ts';
import type { RelayedUsage } from './usage-relay.ts';
import { toApiError } from './error-handler.ts';

export interface ColdBootOptions {
  /** A boot not over within this long commits the response to 200 and starts the keepalives (about 1 s). */
  graceMs: number;
  /** Time between keepalive bytes once committed. */
  keepaliveMs: number;
  /** The contract's cold-boot safety deadline (14 minutes): no request waits for a boot longer. */
  deadlineMs: number;
}

/** What the completion route is given: each model's platform and the timings. */
export interface ColdBoots {
  platformOf(modelId: string): Platform | undefined;
  options: ColdBootOptions;
}

const jsonKeepalive = ' ';
const sseKeepalive = ': keepalive\n\n';

class BootDeadline extends Error {}

/**
 * One request's side of a cold boot. Made when the request starts (it holds the model's engine up
 * until the response closes); `waitOut` before each engine call; once `committed`, the route hands
 * the engine's body or its failure to `end`, `pipe`, `sendCapture`, `handOver` or `fail`.
 */
export class ColdBootWait {
  committed = false;
  /** The client left while the last `waitOut` waited for the boot: the engine was never called for it. */
  leftDuringBoot = false;
  #keepalive: NodeJS.Timeout | null = null;
  readonly #platform: Platform;
  /** The boot whose grace `beforeAdmission` already waited out: `waitOut` commits without waiting it again. */
  #graceSpentOn: Boot | null = null;

  constructor(
    private readonly reply: FastifyReply,
    private readonly stream: boolean,
    private readonly upstreamHeaders: Record<string, string>,
    private readonly options: ColdBootOptions,
    platform: Platform,
  ) {
    this.#platform = platform;
    const release = platform.hold();
    reply.raw.once('close', () => {
      release();
      this.#stopKeepalive();
    });
  }

  static begin(boots: ColdBoots | undefined, modelId: string, reply: FastifyReply, stream: boolean, upstreamHeaders: Record<string, string>): ColdBootWait | null {
    const platform = boots?.platformOf(modelId);
    return platform && boots ? new ColdBootWait(reply, stream, upstreamHeaders, boots.options, platform) : null;
  }

  /**
   * Before anything is held (no reservation yet): a cold model's boot is waited for until the platform
   * acknowledges it, then up to the grace. A boot that stalls or fails meanwhile throws its 503
   * platform_cold_boot, for the route to refuse the request (recorded as rejected, nothing to release);
   * one still booting after the grace returns, and `waitOut` commits as soon as the reservation is
   * durable. Null, with no wait at all, when the engine serves. A client that leaves throws its
   * signal's reason.
   */
  beforeAdmission(signal: AbortSignal): Promise<void> | null {
    const boot = this.#platform.ensureRunning();
    return boot ? this.#acknowledgedWithinGrace(boot, signal) : null;
  }

  async #acknowledgedWithinGrace(boot: Boot, signal: AbortSignal): Promise<void> {
    let grace: NodeJS.Timeout | undefined;
    try {
      await this.#raced(boot.acknowledged, signal);
      // The grace runs from the acknowledgement, as in waitOut.
      const over = new Promise<void>((resolve) => {
        grace = setTimeout(resolve, this.options.graceMs);
      });
      await this.#raced(Promise.race([boot.ready, over]), signal);
      this.#graceSpentOn = boot;
    } catch (err) {
      if (signal.aborted && err === signal.reason) throw err;
      throw this.#bootError(err);
    } finally {
      clearTimeout(grace);
    }
  }

  /** `work`, or the signal's reason once it aborts, or BootDeadline past the safety deadline. */
  async #raced<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
    let deadline: NodeJS.Timeout | undefined;
    let onAbort = () => {};
    try {
      return await Promise.race([
        work,
        new Promise<never>((_, reject) => {
          onAbort = () => reject(signal.reason);
          if (signal.aborted) onAbort();
          else signal.addEventListener('abort', onAbort, { once: true });
        }),
        new Promise<never>((_, reject) => {
          deadline = setTimeout(() => reject(new BootDeadline()), this.options.deadlineMs);
        }),
      ]);
    } finally {
      clearTimeout(deadline);
      signal.removeEventListener('abort', onAbort);
    }
  }

  /**
   * Resolves once the model's engine serves (at once when it is warm). Commits the response only after
   * `durable` settles (no byte before the reservation is stored) and only if `signal` has not aborted.
   * Throws 503 platform_cold_boot before the commit, the same code inside the 200 body after it.
   */
  async waitOut(signal: AbortSignal, durable: Promise<unknown>, maxTokensClamped?: string | null): Promise<void> {
    this.leftDuringBoot = false;
    const boot = this.#platform.ensureRunning();
    if (!boot) return;
    let deadline: NodeJS.Timeout | undefined;
    let grace: NodeJS.Timeout | undefined;
    let onAbort = () => {};
    const aborted = new Promise<never>((_, reject) => {
      onAbort = () => reject(signal.reason);
      if (signal.aborted) onAbort();
      else signal.addEventListener('abort', onAbort, { once: true });
    });
    const pastDeadline = new Promise<never>((_, reject) => {
      deadline = setTimeout(() => reject(new BootDeadline()), this.options.deadlineMs);
    });
    try {
      await Promise.race([boot.acknowledged, aborted, pastDeadline]);
      // Waited out already before admission (the same boot): commit once the reservation is durable.
      const graceMs = this.#graceSpentOn === boot ? 0 : this.options.graceMs;
      const graceOver = new Promise<'grace'>((resolve) => {
        grace = setTimeout(() => resolve('grace'), graceMs);
      });
      if ((await Promise.race([boot.ready, graceOver, aborted, pastDeadline])) !== 'grace') return;
      // A refused or voided reservation answers otherwise: this call's result is dropped, nothing is committed.
      const stored = await Promise.race([durable.then(() => true, () => false), aborted]);
      if (signal.aborted) throw signal.reason;
      if (!stored) throw new Error('the reservation was refused while the model booted');
      this.#commit(maxTokensClamped);
      await Promise.race([boot.ready, aborted, pastDeadline]);
    } catch (err) {
      if (signal.aborted && err === signal.reason) {
        this.leftDuringBoot = true;
        throw err;
      }
      throw this.#bootError(err);
    } finally {
      clearTimeout(deadline);
      clearTimeout(grace);
      signal.removeEventListener('abort', onAbort);
      aborted.catch(() => {});
      pastDeadline.catch(() => {});
    }
  }

  #bootError(err: unknown): ApiError {
    const id = this.#platform.modelId;
    const headers = this.upstreamHeaders;
    if (err instanceof BootDeadline) {
      return apiError('platform_cold_boot', `model "${id}" did not finish booting within the ${Math.round(this.options.deadlineMs / 1000)} s cold-boot safety deadline`, { headers });
    }
    if (err instanceof BootStalled) {
      return apiError('platform_cold_boot', `model "${id}" is scaled to zero and its engine stalled before the platform acknowledged the boot (${err.message}); retry later`, { headers });
    }
    return apiError('platform_cold_boot', `model "${id}" failed to boot: ${(err as Error)?.message ?? String(err)}`, { headers });
  }

  /** Status 200 and the headers go out now; a keepalive byte at once and every `keepaliveMs` after. */
  #commit(maxTokensClamped?: string | null): void {
    if (this.committed) return;
    this.committed = true;
    const { reply } = this;
    reply.hijack();
    const headers: Record<string, string | number | string[]> = {
      ...(reply.getHeaders() as Record<string, string | number | string[]>),
      ...this.upstreamHeaders,
      'content-type': this.stream ? 'text/event-stream; charset=utf-8' : 'application/json',
      'cache-control': 'no-cache',
      'x-accel-buffering': 'no',
    };
    if (maxTokensClamped) headers['x-svc-max-tokens-clamped'] = maxTokensClamped;
    reply.raw.writeHead(200, headers);
    const beat = () => {
      if (!reply.raw.writableEnded && !reply.raw.destroyed) reply.raw.write(this.stream ? sseKeepalive : jsonKeepalive);
    };
    beat();
    this.#keepalive = setInterval(beat, this.options.keepaliveMs);
  }

  #stopKeepalive(): void {
    if (this.#keepalive) clearInterval(this.#keepalive);
    this.#keepalive = null;
  }

  /** A stream's relay takes over the committed response (no more keepalives); false when nothing was committed. */
  handOver(): boolean {
    this.#stopKeepalive();
    return this.committed;
  }

  /** The engine's whole body after the keepalives. */
  end(body: Buffer): FastifyReply {
    this.#stopKeepalive();
    this.reply.raw.end(body);
    return this.reply;
  }

  /** The engine's body, as it arrives, after the keepalives (never compressed: the headers went out without an encoding). */
  pipe(body: Readable): FastifyReply {
    this.#stopKeepalive();
    body.once('error', () => this.reply.raw.destroy());
    body.pipe(this.reply.raw);
    return this.reply;
  }

  /** A capture is checked whole (capture-relay.ts) before its bytes follow the keepalives; a short one is an error in the body. */
  /** `started`: the capture's check, when the route began it as the engine answered. */
  async sendCapture(upstream: EngineResponse, expectedLayers: number | null, signal: AbortSignal, relayed: RelayedUsage, started: Promise<CheckedCapture | null> | null = null): Promise<FastifyReply> {
    try {
      const checked = await (started ?? checkCapture(upstream, expectedLayers, this.upstreamHeaders, signal, relayed));
      if (checked === null) return this.reply; // the client left
      this.#stopKeepalive();
      if (!Array.isArray(checked.body)) return this.pipe(checked.body);
      const res = this.reply.raw;
      res.cork();
      for (const chunk of checked.body) res.write(chunk);
      checked.body.length = 0;
      res.uncork();
      res.end();
      return this.reply;
    } catch (err) {
      return this.fail(err);
    }
  }

  /** A failure after the commit: the contract's top-level `error` object in the 200 body, or an SSE error frame then `[DONE]`. */
  fail(err: unknown): FastifyReply {
    this.#stopKeepalive();
    const error = toApiError(err);
    if (error.code === 'internal_error') this.reply.log.error({ err: { message: (err as Error)?.message, stack: (err as Error)?.stack } }, 'unhandled error after a cold boot');
    const body = JSON.stringify(error.body(this.reply.request.id));
    this.reply.raw.end(this.stream ? `data: ${body}\n\ndata: [DONE]\n\n` : body);
    return this.reply;
  }
}
