// vLLM's sampling order: penalties (repetition over prompt+output, frequency/presence over output), greedy at
// temperature 0, temperature, min_p, top_k, top_p, then a draw from the seeded PRNG.
import type { Prng } from './prng.ts';

export interface SamplingParams {
  temperature: number;
  topP: number;
  topK: number; // -1 (or 0) disables
  minP: number;
  presencePenalty: number;
  frequencyPenalty: number;
  repetitionPenalty: number;
}

const SAMPLING_EPS = 1e-5;
const FLT_MAX = 3.4028234663852886e38;

/** Per-choice penalty state: which tokens the prompt holds and how often each was generated. */
export class PenaltyState {
  readonly inPrompt: Uint8Array;
  readonly outCounts: Int32Array;
  readonly outSeen: number[] = [];

  constructor(vocabSize: number, prompt: ArrayLike<number>) {
    this.inPrompt = new Uint8Array(vocabSize);
    for (let i = 0; i < prompt.length; i++) this.inPrompt[prompt[i]] = 1;
    this.outCounts = new Int32Array(vocabSize);
  }

  add(token: number): void {
    if (this.outCounts[token]++ === 0) this.outSeen.push(token);
  }
}

export class Sampler {
  readonly #vocab: number;
  readonly #w: Float32Array;
  readonly #p: Float64Array;
  readonly #keys: Float64Array;
  readonly #keyBits: Uint32Array;
  readonly #order: Uint32Array;

  constructor(vocabSize: number) {
    this.#vocab = vocabSize;
    this.#w = new Float32Array(vocabSize);
    this.#p = new Float64Array(vocabSize);
    this.#keys = new Float64Array(vocabSize);
    this.#keyBits = new Uint32Array(this.#keys.buffer);
    this.#order = new Uint32Array(vocabSize);
  }

  sample(logits: Float32Array, params: SamplingParams, state: PenaltyState, rng: Prng): number {
    const V = this.#vocab;
    const w = this.#w;
    w.set(logits);
    const rp = params.repetitionPenalty;
    if (rp !== 1) {
      for (let v = 0; v < V; v++) {
        if (state.inPrompt[v] || state.outCounts[v]) w[v] = w[v] > 0 ? w[v] / rp : w[v] * rp;
      }
    }
    if (params.frequencyPenalty !== 0 || params.presencePenalty !== 0) {
      for (const v of state.outSeen) w[v] -= params.frequencyPenalty * state.outCounts[v] + params.presencePenalty;
    }
    if (params.temperature < SAMPLING_EPS) return argmax(w, V);
    const invT = 1 / params.temperature;
    let max = -Infinity;
    for (let v = 0; v < V; v++) {
      w[v] *= invT;
      if (w[v] > max) max = w[v];
    }
    const p = this.#p;
    let sum = 0;
    for (let v = 0; v < V; v++) sum += p[v] = Math.exp(w[v] - max);
    if (params.minP > 0) {
      // Probabilities relative to the most likely token: p/pmax = exp(w - max).
      const cut = params.minP;
      sum = 0;
      for (let v = 0; v < V; v++) {
        if (p[v] < cut) p[v] = 0;
        sum += p[v];
      }
    }
    const topK = params.topK > 0 && params.topK < V ? params.topK : 0;
    if (topK > 0 || params.topP < 1) {
      const n = this.#sortByProbDesc(p, sum, params.topP);
      const order = this.#order;
      let keep = n;
      if (topK > 0 && topK < n) {
        // Ties with the k-th value are kept, as vLLM masks values strictly below it.
        const kth = p[order[topK - 1]];
        keep = topK;
        while (keep < n && p[order[keep]] === kth) keep++;
      }
      if (params.topP < 1) {
        let kept = 0;
        for (let i = 0; i < keep; i++) kept += p[order[i]];
        // Drop from the least likely end while the dropped mass stays <= 1 - top_p (at least one survives).
        let dropped = 0;
        const limit = (1 - params.topP) * kept;
        while (keep > 1 && dropped + p[order[keep - 1]] <= limit) dropped += p[order[--keep]];
      }
      let total = 0;
      for (let i = 0; i < keep; i++) total += p[order[i]];
      let u = rng.next() * total;
      for (let i = 0; i < keep; i++) {
        u -= p[order[i]];
        if (u < 0) return order[i];
      }
      return order[keep - 1];
    }
    let u = rng.next() * sum;
    let last = 0;
    for (let v = 0; v < V; v++) {
      if (p[v] === 0) continue;
      last = v;
      u -= p[v];
      if (u < 0) return v;
    }
    return last;
  }

  /** Orders tokens by probability (desc) into #order; returns how many have non-negligible mass. */
  #sortByProbDesc(p: Float64Array, sum: number, topP: number): number {
    const V = this.#vocab;
    // Tokens below 1e-9 of the mass can never survive top_p <= 0.99995 (their total is < V * 1e-9), nor matter to top_k.
    const floor = topP <= 0.99995 ? sum * 1e-9 : 0;
    let n = 0;
    const keys = this.#keys;
    const bits = this.#keyBits;
    for (let v = 0; v < V; v++) {
      if (p[v] > floor) {
        keys[n] = -Math.fround(p[v]);
        bits[2 * n] |= v; // the low mantissa bits of a float32-valued double are zero: carry the index there
        n++;
      }
    }
    const view = keys.subarray(0, n);
    view.sort();
    for (let i = 0; i < n; i++) this.#order[i] = bits[2 * i] & 0x1fffff;
    return n;
  }
}

export function argmax(w: ArrayLike<number>, n: number): number {
  let best = 0;
  let max = -Infinity;
  for (let v = 0; v < n; v++) {
    if (w[v] > max) {
      max = w[v];
      best = v;
    }
  }
  return best;
}

/** log_softmax in double precision, rounded to float32 like a float32 tensor. */
export function logSoftmax(logits: Float32Array, out: Float32Array): void {
  const n = logits.length;
  let max = -Infinity;
  for (let i = 0; i < n; i++) if (logits[i] > max) max = logits[i];
  let sum = 0;
  for (let i = 0; i < n; i++) sum += Math.exp(logits[i] - max);
  const lse = max + Math.log(sum);
  for (let i = 0; i < n; i++) out[i] = logits[i] - lse;
}

/** Descending argsort of float32 values (ties by higher index first) using a native Float64Array sort. */
export class Ranker {
  readonly #keys: Float64Array;
  readonly #bits: Uint32Array;
  readonly order: Uint32Array;

  constructor(size: number) {
    this.#keys = new Float64Array(size);
    this.#bits = new Uint32Array(this.#keys.buffer);
    this.order = new Uint32Array(size);
  }

  /** Fills `order` with the indices of `values` sorted by value, largest first. */
  sortDesc(values: Float32Array): Uint32Array {
    const n = values.length;
    const keys = this.#keys;
    const bits = this.#bits;
    for (let i = 0; i < n; i++) {
      const x = values[i];
      keys[i] = x > -FLT_MAX ? x : -FLT_MAX; // -Infinity with index bits would become NaN
      bits[2 * i] |= i;
    }
    keys.subarray(0, n).sort();
    for (let i = 0; i < n; i++) this.order[n - 1 - i] = bits[2 * i] & 0x1fffff;
    return this.order;
  }
}

/** 1-based rank: 1 + the number of values strictly greater. */
export function rankOf(values: Float32Array, id: number): number {
  const x = values[id];
  let r = 1;
  for (let i = 0; i < values.length; i++) if (values[i] > x) r++;
  return r;
}

/** Indices of the k largest values, largest first (ties: lower index first). */
export function topK(values: Float32Array, k: number): number[] {
  const idx: number[] = [];
  if (k <= 0) return idx;
  const vals: number[] = [];
  for (let i = 0; i < values.length; i++) {
    const x = values[i];
    if (idx.length === k && x <= vals[k - 1]) continue;
    let j = idx.length === k ? k - 1 : idx.length;
    while (j > 0 && vals[j - 1] < x) {
      if (j < k) {
        vals[j] = vals[j - 1];
        idx[j] = idx[j - 1];
      }
      j--;
    }
    vals[j] = x;
    idx[j] = i;
  }
  return idx;
}
