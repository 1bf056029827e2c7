import type { Logger } from 'pino';
import { apiError } from '../errors/index.ts';
import { spawnReferenceEngine, type SpawnedEngine } from '../reference-engine/index.ts';

export interface SupervisedEngineOptions {
  configPath: string | null;
  chaos?: boolean;
  logger: Logger;
  /** Called with the new address after a restart. */
  onRestart(url: string): void;
}

const firstBackoffMs = 1_000;
const maxBackoffMs = 30_000;
/** An engine that stayed up this long resets the backoff. */
const stableAfterMs = 60_000;

/**
 * A reference engine child process that is started again, with backoff, when it dies on its own, so a
 * crash costs the requests in flight and a few seconds, not the model until the gateway restarts.
 */
export class SupervisedEngine {
  #engine: SpawnedEngine | null = null;
  #stopping = false;
  #backoffMs = firstBackoffMs;
  #restartTimer: NodeJS.Timeout | null = null;
  bootedAt = 0;
  /** When the engine last died (0: never), so a restart's stage can say since when. */
  #diedAt = 0;
  /** Requests waiting out a restart: told when the engine is up again (or the supervisor stops). */
  readonly #waiting = new Set<{ resolve(): void; reject(error: unknown): void }>();

  constructor(
    readonly modelId: string,
    private readonly options: SupervisedEngineOptions,
  ) {}

  get url(): string {
    return this.#engine!.url;
  }

  get pid(): number {
    return this.#engine!.pid;
  }

  get alive(): boolean {
    return this.#engine !== null && this.#restartTimer === null;
  }

  /** Where the engine's latest boot stands: `ready` since it came up, or `restarting` since it died. */
  get stage(): { stage: 'ready' | 'restarting'; at: string } {
    return this.alive ? { stage: 'ready', at: new Date(this.bootedAt).toISOString() } : { stage: 'restarting', at: new Date(this.#diedAt).toISOString() };
  }

  /** Null while the engine is up; else resolves once it is up again (rejects when `signal` aborts or the supervisor stops). */
  whenAlive(signal: AbortSignal): Promise<void> | null {
    if (this.alive) return null;
    return new Promise<void>((resolve, reject) => {
      const waiter = {
        resolve: () => {
          signal.removeEventListener('abort', abort);
          resolve();
        },
        reject: (error: unknown) => {
          signal.removeEventListener('abort', abort);
          reject(error);
        },
      };
      const abort = () => {
        this.#waiting.delete(waiter);
        reject(signal.reason);
      };
      if (signal.aborted) return abort();
      signal.addEventListener('abort', abort, { once: true });
      this.#waiting.add(waiter);
    });
  }

  #tellWaiting(error?: unknown): void {
    for (const waiter of this.#waiting) (error === undefined ? waiter.resolve() : waiter.reject(error));
    this.#waiting.clear();
  }

  async start(): Promise<void> {
    const engine = await spawnReferenceEngine(this.modelId, { configPath: this.options.configPath, chaos: this.options.chaos });
    this.#engine = engine;
    this.bootedAt = Date.now();
    void engine.exited.then((code) => this.#exited(engine, code));
  }

  #exited(engine: SpawnedEngine, code: number | null): void {
    if (this.#stopping || engine !== this.#engine) return;
    this.#diedAt = Date.now();
    const upMs = Date.now() - this.bootedAt;
    if (upMs > stableAfterMs) this.#backoffMs = firstBackoffMs;
    const delay = this.#backoffMs;
    this.#backoffMs = Math.min(this.#backoffMs * 2, maxBackoffMs);
    this.options.logger.error({ model: this.modelId, pid: engine.pid, code, restart_in_ms: delay }, 'reference engine exited; restarting');
    this.#restartTimer = setTimeout(() => void this.#restart(), delay);
    this.#restartTimer.unref();
  }

  async #restart(): Promise<void> {
    if (this.#stopping) return;
    try {
      await this.start();
      this.#restartTimer = null;
      if (this.#stopping) return void (await this.#engine?.stop()); // the gateway began stopping meanwhile
      this.options.logger.info({ model: this.modelId, url: this.url, pid: this.pid }, 'reference engine restarted');
      this.options.onRestart(this.url);
      this.#tellWaiting();
    } catch (err) {
      this.options.logger.error({ model: this.modelId, err: (err as Error).message }, 'reference engine restart failed');
      this.#restartTimer = null;
      this.#exited(this.#engine!, null);
    }
  }

  /** The gateway is stopping: an exit from now on is not a crash, and the engine is not started again. */
  shuttingDown(): void {
    this.#stopping = true;
    if (this.#restartTimer) clearTimeout(this.#restartTimer);
  }

  async stop(): Promise<void> {
    this.#stopping = true;
    this.#tellWaiting(apiError('upstream_unreachable', 'the model server was stopped while the request waited for it to start'));
    if (this.#restartTimer) clearTimeout(this.#restartTimer);
    await this.#engine?.stop();
  }
}
