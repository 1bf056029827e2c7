/**
 * The context length of a model whose registry entry leaves it unknown (`max_model_len` null), asked of
 * its engine once: the engine's `/tokenize` answers with `max_model_len` (ENGINE.md), which an injected
 * default max_tokens is then sized to (the contract: min(32,000, remaining model context)). Learned
 * values are kept for the process's life (an engine's context is fixed by its deployment); concurrent
 * requests share one question; a failed question is asked again by the next request.
 */
import type { EngineClient } from '../engine-client/index.ts';
import { fitDefaultToContext, needsEngineContextLength, type PreparedCompletion } from '../completion-request/index.ts';

export class EngineContextLengths {
  readonly #engines: Pick<EngineClient, 'post'>;
  readonly #boot: ((modelId: string, signal: AbortSignal) => Promise<void> | null) | undefined;
  readonly #known = new Map<string, number>();
  readonly #asking = new Map<string, Promise<number | null>>();

  constructor(engines: Pick<EngineClient, 'post'>, boot?: (modelId: string, signal: AbortSignal) => Promise<void> | null) {
    this.#engines = engines;
    this.#boot = boot;
  }

  /**
   * The completion with its injected default sized to the engine's context when the registry does not
   * know it; as it is otherwise, or when the engine cannot say (the engine then judges the request
   * itself, as before). Throws 400 `context_length_exceeded` when the prompt leaves no room.
   */
  async fit(prepared: PreparedCompletion, signal?: AbortSignal): Promise<PreparedCompletion> {
    if (!needsEngineContextLength(prepared)) return prepared;
    const length = await this.of(prepared.model.id, prepared.model.checkpoint, signal);
    return length === null ? prepared : fitDefaultToContext(prepared, length);
  }

  /** The engine's `max_model_len`, or null when it could not be asked. */
  of(modelId: string, checkpoint: string, signal?: AbortSignal): Promise<number | null> {
    const known = this.#known.get(modelId);
    if (known !== undefined) return Promise.resolve(known);
    let asking = this.#asking.get(modelId);
    if (!asking) {
      asking = this.#ask(modelId, checkpoint).finally(() => this.#asking.delete(modelId));
      this.#asking.set(modelId, asking);
    }
    if (!signal) return asking;
    // A client that leaves stops waiting; the question goes on for the others.
    const question = asking;
    return new Promise((resolve, reject) => {
      const left = () => reject(signal.reason);
      if (signal.aborted) return left();
      signal.addEventListener('abort', left, { once: true });
      question.then(resolve, reject).finally(() => signal.removeEventListener('abort', left));
    });
  }

  async #ask(modelId: string, checkpoint: string): Promise<number | null> {
    // Its own signal: one request's client leaving must not fail the question the others wait on.
    const signal = AbortSignal.timeout(30_000);
    try {
      await this.#boot?.(modelId, signal);
      const res = await this.#engines.post(modelId, '/tokenize', JSON.stringify({ model: checkpoint, prompt: '', add_special_tokens: false }), signal);
      try {
        const answer = (await res.body.json()) as { max_model_len?: unknown };
        const length = answer.max_model_len;
        if (typeof length !== 'number' || !Number.isInteger(length) || length < 1) return null;
        this.#known.set(modelId, length);
        return length;
      } finally {
        res.release();
      }
    } catch {
      return null;
    }
  }
}
