// `local-process`: the gateway runs the model's reference engine as a child process, started on demand
// and stopped after an idle window (scale to zero). Every boot publishes its stages; a crashed engine is
// started again with backoff, and requests meanwhile wait out that boot as they would a cold one.
import { setTimeout as sleep } from 'node:timers/promises';
import type { Logger } from 'pino';
import { spawnReferenceEngine, type ChaosMode, type SpawnedEngine } from '../reference-engine/index.ts';
import { BootFailed, BootStalled, type Boot, type BootStage, type BootStageListener, type Platform, type PublishedStage } from './types.ts';

/** Knobs of the engine's boot, read at every spawn (tests change them between boots). */
export interface EngineBootKnobs {
  /** The engine waits this long while "loading its weights". */
  delayMs?: number;
  /** The engine exits after loading instead of listening. */
  fail?: boolean;
  /** The engine process waits this long before it reports that it started. */
  startStallMs?: number;
  /** The engine's first completion fails this way (`--chaos-mode`; needs chaos engines): a failure right after a boot. */
  chaosMode?: ChaosMode;
}

export interface LocalProcessOptions {
  modelId: string;
  configPath: string | null;
  /** Start the engine with its failure-injection route (tests). */
  chaos?: boolean;
  knobs?: EngineBootKnobs;
  /** No request for this long stops the engine; 0 never does. */
  idleMs: number;
  /** A boot whose process has not reported starting within this long is abandoned (503 platform_cold_boot). */
  ackTimeoutMs: number;
  logger: Logger;
  onStage: BootStageListener;
  /** A new engine serves at `url` (the engine client is pointed at it). */
  onServing(url: string, pid: number): void;
}

const firstBackoffMs = 1_000;
const maxBackoffMs = 30_000;
/** An engine that stayed up this long resets the restart backoff. */
const stableAfterMs = 60_000;
const healthTimeoutMs = 5_000;

interface BootInProgress extends Boot {
  abandon: AbortController;
}

function deferred(): { promise: Promise<void>; resolve(): void; reject(error: Error): void } {
  let resolve!: () => void;
  let reject!: (error: Error) => void;
  const promise = new Promise<void>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  promise.catch(() => {}); // a boot nobody waits for may fail unobserved
  return { promise, resolve, reject };
}

export class LocalProcessPlatform implements Platform {
  readonly kind = 'local-process';
  /** Engine processes spawned so far (tests count them: concurrent cold requests share one boot). */
  spawns = 0;
  #engine: SpawnedEngine | null = null;
  #servingSince = 0;
  #boot: BootInProgress | null = null;
  #stage: PublishedStage | null = null;
  #holds = 0;
  #idleTimer: NodeJS.Timeout | null = null;
  #backoffMs = firstBackoffMs;
  #stopping = false;

  constructor(private readonly options: LocalProcessOptions) {}

  get modelId(): string {
    return this.options.modelId;
  }

  get url(): string | null {
    return this.#engine?.url ?? null;
  }

  /** The serving engine's process id, or null. */
  get pid(): number | null {
    return this.#engine?.pid ?? null;
  }

  /** A boot is under way (a cold start or a crashed engine's restart). */
  get booting(): boolean {
    return this.#boot !== null;
  }

  ensureRunning(): Boot | null {
    if (this.#engine && !this.#boot) return null;
    return (this.#boot ??= this.#startBoot(0));
  }

  hold(): () => void {
    this.#holds++;
    if (this.#idleTimer) clearTimeout(this.#idleTimer);
    this.#idleTimer = null;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.#holds--;
      this.#scheduleIdleStop();
    };
  }

  runners(): number {
    return this.#engine && !this.#boot ? 1 : 0;
  }

  latestStage(): PublishedStage | null {
    return this.#stage;
  }

  async warmUp(): Promise<void> {
    await this.ensureRunning()?.ready;
  }

  shuttingDown(): void {
    this.#stopping = true;
  }

  async stop(): Promise<void> {
    this.#stopping = true;
    if (this.#idleTimer) clearTimeout(this.#idleTimer);
    this.#boot?.abandon.abort(new BootFailed('the gateway is stopping'));
    const engine = this.#engine;
    this.#engine = null;
    await engine?.stop();
  }

  #publish(stage: BootStage, reason: string | null = null): void {
    this.#stage = { stage, at: Date.now(), reason };
    this.options.onStage(this.modelId, 'completion', stage, reason);
  }

  /** One boot: waits `delayMs` (a crash's backoff), spawns the engine, and follows it until it serves or fails. */
  #startBoot(delayMs: number): BootInProgress {
    const acknowledged = deferred();
    const ready = deferred();
    const abandon = new AbortController();
    const boot: BootInProgress = { acknowledged: acknowledged.promise, ready: ready.promise, abandon };
    const fail = (error: Error) => {
      if (this.#boot === boot) this.#boot = null;
      acknowledged.reject(error);
      ready.reject(error);
      if (!this.#stopping) this.#publish('failed', error.message.slice(0, 1000));
    };
    this.#publish('waiting_for_gpu');
    const run = async () => {
      // A crash's backoff; a stop cancels it.
      if (delayMs > 0) await sleep(delayMs, undefined, { signal: abandon.signal }).catch(() => {});
      if (this.#stopping) throw new BootFailed('the gateway is stopping');
      const knobs = this.options.knobs ?? {};
      // The process must report that it started within the acknowledgement timeout, or it is given up.
      const stall = setTimeout(() => abandon.abort(new BootStalled(`the engine process did not start within ${this.options.ackTimeoutMs} ms`)), this.options.ackTimeoutMs);
      this.spawns++;
      let engine: SpawnedEngine;
      try {
        engine = await spawnReferenceEngine(this.modelId, {
          configPath: this.options.configPath,
          chaos: this.options.chaos,
          bootDelayMs: knobs.delayMs,
          bootFail: knobs.fail,
          startStallMs: knobs.startStallMs,
          chaosMode: knobs.chaosMode,
          signal: abandon.signal,
          onStage: (stage) => {
            if (stage === 'container_started') {
              clearTimeout(stall);
              acknowledged.resolve();
            }
            this.#publish(stage);
          },
        });
      } catch (err) {
        throw abandon.signal.aborted ? (abandon.signal.reason as Error) : new BootFailed(`the engine failed to boot: ${(err as Error).message}`);
      } finally {
        clearTimeout(stall);
      }
      acknowledged.resolve();
      if (abandon.signal.aborted) {
        await engine.stop();
        throw abandon.signal.reason as Error;
      }
      this.#publish('engine_ready');
      // Serving once the engine answers its health check, as a platform's readiness probe would.
      const health = await fetch(`${engine.url}/health`, { signal: AbortSignal.timeout(healthTimeoutMs) }).catch((err: Error) => err);
      if (health instanceof Error || !health.ok) {
        await engine.stop();
        throw new BootFailed(`the engine's health check failed: ${health instanceof Error ? health.message : `status ${health.status}`}`);
      }
      await health.arrayBuffer();
      return engine;
    };
    run().then(
      (engine) => {
        if (this.#stopping) return void engine.stop();
        this.#engine = engine;
        this.#servingSince = Date.now();
        this.#boot = null;
        this.#publish('serving');
        this.options.logger.info({ model: this.modelId, url: engine.url, pid: engine.pid }, 'reference engine started');
        this.options.onServing(engine.url, engine.pid);
        void engine.exited.then((code) => this.#exited(engine, code));
        ready.resolve();
        this.#scheduleIdleStop();
      },
      (error: Error) => {
        this.options.logger.error({ model: this.modelId, err: error.message }, 'reference engine boot failed');
        fail(error);
      },
    );
    return boot;
  }

  /** An engine that dies on its own is started again after a backoff; requests meanwhile wait out that boot. */
  #exited(engine: SpawnedEngine, code: number | null): void {
    if (this.#stopping || engine !== this.#engine) return;
    this.#engine = null;
    if (Date.now() - this.#servingSince > stableAfterMs) this.#backoffMs = firstBackoffMs;
    const delay = this.#backoffMs;
    this.#backoffMs = Math.min(this.#backoffMs * 2, maxBackoffMs);
    this.options.logger.error({ model: this.modelId, pid: engine.pid, code, restart_in_ms: delay }, 'reference engine exited; restarting');
    this.#publish('failed', `the engine exited (code ${code ?? 'signal'})`);
    this.#boot = this.#startBoot(delay);
  }

  #scheduleIdleStop(): void {
    if (this.options.idleMs <= 0 || this.#holds > 0 || !this.#engine || this.#stopping) return;
    if (this.#idleTimer) clearTimeout(this.#idleTimer);
    this.#idleTimer = setTimeout(() => this.scaleToZero(), this.options.idleMs);
    this.#idleTimer.unref();
  }

  /**
   * What the idle window does when it lapses: stops the engine unless a request holds it or a boot is
   * under way; the next request boots it again. Says whether it stopped one.
   */
  scaleToZero(): boolean {
    if (this.#idleTimer) clearTimeout(this.#idleTimer);
    this.#idleTimer = null;
    const engine = this.#engine;
    if (this.#holds > 0 || !engine || this.#boot) return false;
    // Its last boot is no longer the serving container's.
    this.#engine = null;
    this.#stage = null;
    this.options.logger.info({ model: this.modelId, pid: engine.pid, idle_ms: this.options.idleMs }, 'reference engine idle: stopped');
    void engine.stop();
    return true;
  }
}
