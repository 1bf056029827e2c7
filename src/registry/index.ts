// The model registry: which models exist, which one is the default, which are listed, and each model's
// tokenizer, loaded at start and retried in the background when it fails (other models unaffected).
import { defaultModel, isListed, type ModelConfig } from '../config/index.ts';
import { apiError } from '../errors/index.ts';
import { loadTokenizer, type Tokenizer } from '../tokenizer/index.ts';

export type TokenizerLoader = (spec: ModelConfig['tokenizer']) => Promise<Tokenizer>;

export interface RegistryOptions {
  /** First retry delay after a failed tokenizer load (ms); doubles up to `retryMaxMs`. */
  retryInitialMs?: number;
  retryMaxMs?: number;
  /** Defaults to the shared tokenizer module. */
  loadTokenizer?: TokenizerLoader;
  /** Told about every failed load (metadata only: model id and the loader's message). */
  onTokenizerError?: (modelId: string, error: Error, nextRetryMs: number) => void;
}

export type TokenizerState =
  | { status: 'pending' }
  | { status: 'ready'; tokenizer: Tokenizer }
  | { status: 'failed'; error: string; attempts: number; nextRetryAt: number };

interface Slot {
  state: TokenizerState;
  timer: NodeJS.Timeout | null;
  /** The attempt in flight, so a second loadTokenizers() joins it instead of racing it. */
  loading: Promise<void> | null;
  waiters: Array<{ resolve: (t: Tokenizer) => void; reject: (e: Error) => void }>;
}

export class ModelRegistry {
  readonly default: ModelConfig;
  readonly #models: ReadonlyMap<string, ModelConfig>;
  readonly #order: readonly ModelConfig[];
  readonly #slots = new Map<string, Slot>();
  readonly #retryInitialMs: number;
  readonly #retryMaxMs: number;
  readonly #load: TokenizerLoader;
  readonly #onError: RegistryOptions['onTokenizerError'];
  #closed = false;

  constructor(models: readonly ModelConfig[], options: RegistryOptions = {}) {
    this.default = defaultModel(models);
    this.#order = [...models];
    this.#models = new Map(models.map((m) => [m.id, m]));
    this.#retryInitialMs = options.retryInitialMs ?? 1000;
    this.#retryMaxMs = options.retryMaxMs ?? 60_000;
    this.#load = options.loadTokenizer ?? loadTokenizer;
    this.#onError = options.onTokenizerError;
    for (const m of models) this.#slots.set(m.id, { state: { status: 'pending' }, timer: null, loading: null, waiters: [] });
  }

  /** Any configured model, live or staging. */
  get(id: string): ModelConfig | undefined {
    return this.#models.get(id);
  }

  /** Every configured model in configuration order (health shows staging ones too). */
  all(): readonly ModelConfig[] {
    return this.#order;
  }

  /** Live models in configuration order: what `GET /v1/models` lists. Staging models are served but not listed. */
  listed(): ModelConfig[] {
    return this.#order.filter(isListed);
  }

  /** The model a request names: null/omitted is the default; an unknown id is 400 `model_not_found`. */
  resolve(id: string | null | undefined): ModelConfig {
    if (id === null || id === undefined) return this.default;
    const model = this.#models.get(id);
    if (model) return model;
    const available = this.listed().map((m) => m.id).join(', ');
    throw apiError('model_not_found', `model: unknown model id ${JSON.stringify(id)}; available models: ${available}`, {
      fields: { param: 'model' },
    });
  }

  /**
   * Loads every model's tokenizer once, in parallel. Resolves when each has either loaded or failed;
   * failed ones keep retrying in the background with exponential backoff until `close()`.
   */
  async loadTokenizers(): Promise<void> {
    await Promise.all(this.#order.map((m) => this.#attempt(m)));
  }

  /** The model's tokenizer; 503 `tokenizer_unavailable` with Retry-After while it has not loaded. */
  tokenizer(id: string): Tokenizer {
    const slot = this.#slots.get(id);
    if (slot?.state.status === 'ready') return slot.state.tokenizer;
    if (!slot) throw apiError('model_not_found', `model: unknown model id ${JSON.stringify(id)}`);
    const retryAfter =
      slot.state.status === 'failed' ? Math.max(1, Math.ceil((slot.state.nextRetryAt - Date.now()) / 1000)) : 1;
    throw apiError('tokenizer_unavailable', `the tokenizer of model ${id} is not loaded yet; it is retried in the background`, {
      retryAfter,
    });
  }

  tokenizerState(id: string): TokenizerState | undefined {
    return this.#slots.get(id)?.state;
  }

  /**
   * Resolves once the model's tokenizer has loaded (at once if it already has). While someone waits, the
   * pending retry keeps the process alive; `close()` rejects the waiters.
   */
  whenTokenizerReady(id: string): Promise<Tokenizer> {
    const slot = this.#slots.get(id);
    if (!slot) return Promise.reject(new Error(`unknown model ${id}`));
    if (slot.state.status === 'ready') return Promise.resolve(slot.state.tokenizer);
    if (this.#closed) return Promise.reject(new Error('the registry is closed'));
    slot.timer?.ref();
    return new Promise((resolve, reject) => slot.waiters.push({ resolve, reject }));
  }

  /** Stops background retries. */
  close(): void {
    this.#closed = true;
    for (const slot of this.#slots.values()) {
      if (slot.timer) clearTimeout(slot.timer);
      slot.timer = null;
      for (const w of slot.waiters.splice(0)) w.reject(new Error('the registry is closed'));
    }
  }

  #attempt(model: ModelConfig): Promise<void> {
    const slot = this.#slots.get(model.id)!;
    if (this.#closed || slot.state.status === 'ready') return Promise.resolve();
    if (slot.timer) clearTimeout(slot.timer);
    slot.timer = null;
    slot.loading ??= this.#loadOnce(model, slot).finally(() => {
      slot.loading = null;
    });
    return slot.loading;
  }

  async #loadOnce(model: ModelConfig, slot: Slot): Promise<void> {
    const attempts = slot.state.status === 'failed' ? slot.state.attempts + 1 : 1;
    try {
      const tokenizer = await this.#load(model.tokenizer);
      slot.state = { status: 'ready', tokenizer };
      for (const w of slot.waiters.splice(0)) w.resolve(tokenizer);
    } catch (err) {
      const delay = Math.min(this.#retryMaxMs, this.#retryInitialMs * 2 ** (attempts - 1));
      slot.state = { status: 'failed', error: (err as Error).message, attempts, nextRetryAt: Date.now() + delay };
      this.#onError?.(model.id, err as Error, delay);
      if (this.#closed) return;
      slot.timer = setTimeout(() => {
        slot.timer = null;
        void this.#attempt(model);
      }, delay);
      // Background retries never hold the process open, unless someone awaits this tokenizer.
      if (slot.waiters.length === 0) slot.timer.unref();
    }
  }
}
