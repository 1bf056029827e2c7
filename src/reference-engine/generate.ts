// Runs one prompt through the model: prefill, then n choices sampled from a shared prefix cache, with steering
// and residual capture hooks, stop strings, EOS and length limits. Yields to the event loop as it goes.
import { randomInt } from 'node:crypto';
import type { Tokenizer } from '../tokenizer/index.ts';
import type { Model, BlockHook } from './model.ts';
import type { CompletionRequest } from './request.ts';
import { Prng } from './prng.ts';
import { Sampler, PenaltyState, logSoftmax, rankOf, topK } from './sampling.ts';

export interface TopEntry {
  id: number;
  logprob: number;
}

/** One generated token's logprob information (vLLM: the sampled token first, then the top k). */
export interface StepLogprobs {
  id: number;
  logprob: number;
  rank: number;
  top: TopEntry[];
}

export interface TokenEvent {
  promptIndex: number;
  choice: number;
  token: number;
  /** Text released by this token (held back while a stop string or UTF-8 sequence may still be forming). */
  delta: string;
  /** Length of the choice's text released before this token. */
  offset: number;
  logprobs: StepLogprobs | null;
  completionTokens: number;
  finishReason: 'stop' | 'length' | null;
  stopReason: string | null;
}

export interface ChoiceResult {
  choice: number;
  text: string;
  tokens: number[];
  steps: StepLogprobs[] | null;
  finishReason: 'stop' | 'length';
  stopReason: string | null;
}

export interface PromptRun {
  choices: ChoiceResult[];
  /** Final-norm hidden state of every prompt position but the last (position j-1 predicts token j). */
  promptHidden: Float32Array | null;
  /** [layers][positions][d] after steering, when capture was requested. */
  capture: { values: Float32Array; shape: [number, number, number] } | null;
}

export interface RunHooks {
  signal: AbortSignal;
  /** Awaited after every token (chaos: per-token delay, crash). */
  afterToken?: () => unknown;
  /** Called once the prompt has been processed, with its hidden states when they were kept. */
  onPrefill?: (promptHidden: Float32Array | null) => void;
  onToken?: (ev: TokenEvent) => Promise<void> | void;
}

/** Prompt tokens processed layer by layer together (between yields to the event loop). */
const PREFILL_CHUNK = 32;

/** Yields to the event loop when this much time has passed, so /health and other requests stay served. */
const SLICE_MS = 4;

export class Generator {
  readonly model: Model;
  readonly tokenizer: Tokenizer;
  readonly maxModelLen: number;
  readonly #sampler: Sampler;
  readonly #logits: Float32Array;
  readonly #lp: Float32Array;
  #sliceStart = performance.now();

  constructor(model: Model, tokenizer: Tokenizer, maxModelLen: number) {
    this.model = model;
    this.tokenizer = tokenizer;
    this.maxModelLen = maxModelLen;
    this.#sampler = new Sampler(model.shape.vocabSize);
    this.#logits = new Float32Array(model.shape.vocabSize);
    this.#lp = new Float32Array(model.shape.vocabSize);
  }

  async tick(signal: AbortSignal): Promise<void> {
    if (performance.now() - this.#sliceStart >= SLICE_MS) {
      await new Promise((r) => setImmediate(r));
      this.#sliceStart = performance.now();
    }
    if (signal.aborted) throw signal.reason ?? new Error('aborted');
  }

  async runPrompt(req: CompletionRequest, promptIndex: number, hooks: RunHooks): Promise<PromptRun> {
    const { model } = this;
    const { dModel: d, vocabSize: V, eosId } = model.shape;
    const prompt = req.prompts[promptIndex];
    const needPromptHidden = req.promptLogprobs !== null || (req.echo && req.logprobs !== null);
    const promptHidden = needPromptHidden ? new Float32Array(Math.max(prompt.length - 1, 0) * d) : null;
    const capture = req.capture ? new CaptureBuffer(req.capture, d) : null;
    const hook = buildHook(req, capture, d);
    const maxTokens = req.maxTokens ?? this.maxModelLen - prompt.length;

    const base = model.newCache(Math.min(this.maxModelLen, nextPow2(prompt.length + Math.min(maxTokens, 256))));
    const hidden = new Float32Array(d);
    const chunkOut = new Float32Array(PREFILL_CHUNK * d);
    for (let i = 0; i < prompt.length; i += PREFILL_CHUNK) {
      const part = prompt.slice(i, i + PREFILL_CHUNK);
      model.forwardChunk(base, part, chunkOut, hook);
      if (promptHidden) promptHidden.set(chunkOut.subarray(0, Math.min(part.length, prompt.length - 1 - i) * d), i * d);
      if (i + part.length === prompt.length) hidden.set(chunkOut.subarray((part.length - 1) * d, part.length * d));
      await this.tick(hooks.signal);
    }
    const lastPromptHidden = hidden.slice();
    hooks.onPrefill?.(promptHidden);

    const maxStop = req.stop.reduce((m, s) => Math.max(m, s.length), 0);
    const choices: ChoiceResult[] = [];
    for (let c = 0; c < req.n; c++) {
      const cache = c === req.n - 1 ? base : base.clone();
      hidden.set(lastPromptHidden);
      const rng = new Prng(req.seed !== null ? req.seed + c : randomInt(0, 2 ** 48 - 1));
      const penalties = new PenaltyState(V, prompt);
      const decoder = this.tokenizer.newStreamDecoder();
      const tokens: number[] = [];
      const steps: StepLogprobs[] | null = req.logprobs !== null ? [] : null;
      let text = '';
      let released = 0;
      let finishReason: 'stop' | 'length' | null = null;
      let stopReason: string | null = null;
      while (finishReason === null) {
        model.logits(hidden, this.#logits);
        const token = this.#sampler.sample(this.#logits, req.sampling, penalties, rng);
        penalties.add(token);
        tokens.push(token);
        let step: StepLogprobs | null = null;
        if (steps) {
          logSoftmax(this.#logits, this.#lp);
          step = stepLogprobs(this.#lp, token, req.logprobs!);
          steps.push(step);
        }
        if (token === eosId && !req.ignoreEos) finishReason = 'stop';
        else {
          const before = text.length;
          text += decoder.push(token);
          if (maxStop > 0 && text.length > before) {
            for (const s of req.stop) {
              const at = text.indexOf(s, Math.max(0, before - s.length + 1));
              if (at >= 0) {
                text = text.slice(0, at);
                finishReason = 'stop';
                stopReason = s;
                break;
              }
            }
          }
        }
        if (finishReason === null && (tokens.length >= maxTokens || prompt.length + tokens.length >= this.maxModelLen)) finishReason = 'length';
        let until = finishReason !== null ? text.length : Math.max(released, text.length - Math.max(maxStop - 1, 0));
        if (until < text.length && until > released && isHighSurrogate(text.charCodeAt(until - 1))) until--;
        const offset = released;
        const delta = text.slice(released, until);
        released = Math.max(released, until);
        if (hooks.onToken) {
          await hooks.onToken({ promptIndex, choice: c, token, delta, offset, logprobs: step, completionTokens: tokens.length, finishReason, stopReason });
        }
        if (hooks.afterToken) await hooks.afterToken();
        if (finishReason !== null) break;
        model.forward(cache, token, hidden, hook);
        await this.tick(hooks.signal);
      }
      choices.push({ choice: c, text, tokens, steps, finishReason: finishReason!, stopReason });
    }
    return { choices, promptHidden, capture: capture ? capture.result() : null };
  }

  /** log_softmax of the raw logits predicting prompt token `pos` (pos >= 1). */
  promptLogprobsAt(promptHidden: Float32Array, pos: number, out: Float32Array): void {
    const d = this.model.shape.dModel;
    this.model.logits(promptHidden.subarray((pos - 1) * d, pos * d), this.#logits);
    logSoftmax(this.#logits, out);
  }
}

export function stepLogprobs(lp: Float32Array, token: number, k: number): StepLogprobs {
  const top = topK(lp, k).map((id) => ({ id, logprob: lp[id] }));
  return { id: token, logprob: lp[token], rank: rankOf(lp, token), top };
}

function isHighSurrogate(c: number): boolean {
  return c >= 0xd800 && c <= 0xdbff;
}

function nextPow2(n: number): number {
  let p = 64;
  while (p < n) p *= 2;
  return p;
}

class CaptureBuffer {
  readonly layers: number[];
  readonly #slot: Int32Array;
  readonly #d: number;
  #rows: Float32Array[];
  #count = 0;

  constructor(layers: number[], d: number) {
    this.layers = layers;
    this.#d = d;
    this.#slot = new Int32Array(Math.max(...layers) + 1).fill(-1);
    layers.forEach((l, i) => (this.#slot[l] = i));
    this.#rows = layers.map(() => new Float32Array(256 * d));
  }

  record(layer: number, pos: number, h: Float32Array): void {
    const s = layer < this.#slot.length ? this.#slot[layer] : -1;
    if (s < 0) return;
    const d = this.#d;
    let buf = this.#rows[s];
    if ((pos + 1) * d > buf.length) {
      const grown = new Float32Array(Math.max(buf.length * 2, (pos + 1) * d));
      grown.set(buf);
      this.#rows[s] = buf = grown;
    }
    buf.set(h, pos * d);
    if (pos + 1 > this.#count) this.#count = pos + 1;
  }

  result(): { values: Float32Array; shape: [number, number, number] } {
    const d = this.#d;
    const n = this.#count;
    const values = new Float32Array(this.layers.length * n * d);
    this.#rows.forEach((buf, i) => values.set(buf.subarray(0, n * d), i * n * d));
    return { values, shape: [this.layers.length, n, d] };
  }
}

function buildHook(req: CompletionRequest, capture: CaptureBuffer | null, d: number): BlockHook | undefined {
  if (!capture && req.steering.length === 0) return undefined;
  const steer = req.steering;
  return (layer, pos, h) => {
    for (const v of steer) {
      for (let j = 0; j < v.layers.length; j++) {
        if (v.layers[j] !== layer) continue;
        const row = v.positions ? v.positions.get(pos) : 0;
        if (row === undefined) continue;
        const o = (j * v.rows + row) * d;
        let before = 0;
        if (v.normMatch) for (let i = 0; i < d; i++) before += h[i] * h[i];
        for (let i = 0; i < d; i++) h[i] += v.scale * v.values[o + i];
        if (v.normMatch) {
          // The contract's norm_match: rescale the steered state to the original per-token L2 norm.
          let after = 0;
          for (let i = 0; i < d; i++) after += h[i] * h[i];
          if (after > 0) {
            const f = Math.sqrt(before / after);
            for (let i = 0; i < d; i++) h[i] *= f;
          }
        }
      }
    }
    capture?.record(layer, pos, h);
  };
}
