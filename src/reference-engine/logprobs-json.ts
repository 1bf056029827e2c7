// Serializers of the logprob structures vLLM returns, written the way the wire needs them (byte buffers for the
// full vocabulary, strings for the small per-token maps).
import type { Tokenizer } from '../tokenizer/index.ts';
import type { Generator, StepLogprobs } from './generate.ts';
import type { BodyWriter } from './body-writer.ts';
import { Ranker, rankOf, topK } from './sampling.ts';

/** Streams `prompt_logprobs`: [null, {id: {logprob, rank, decoded_token}}...]; k = -1 writes the whole vocabulary. */
export async function writePromptLogprobs(
  w: BodyWriter,
  generator: Generator,
  vocabJson: VocabJson,
  hidden: Float32Array,
  prompt: number[],
  k: number,
  signal: AbortSignal,
): Promise<void> {
  const tokenizer = generator.tokenizer;
  const V = tokenizer.vocabSize;
  const lp = new Float32Array(V);
  // Per request: its order array is read across awaits while other requests sort too.
  const ranker = k === -1 ? new Ranker(V) : null;
  w.push('[null');
  for (let j = 1; j < prompt.length; j++) {
    generator.promptLogprobsAt(hidden, j, lp);
    const actual = prompt[j];
    if (k === -1) {
      const order = ranker!.sortDesc(lp);
      let actualRank = 0;
      for (let i = 0; i < V; i++) if (order[i] === actual) actualRank = i + 1;
      w.push(',{');
      vocabJson.write(w, actual, lp[actual], actualRank);
      for (let i = 0; i < V; i++) {
        const t = order[i];
        if (t === actual) continue;
        w.char(44);
        vocabJson.write(w, t, lp[t], i + 1);
        if (w.full) await w.flush();
      }
      w.push('}');
    } else {
      const top = topK(lp, k);
      const at = top.indexOf(actual);
      w.push(',{');
      vocabJson.write(w, actual, lp[actual], at >= 0 ? at + 1 : rankOf(lp, actual));
      for (let i = 0; i < top.length; i++) {
        if (top[i] === actual) continue;
        w.char(44);
        vocabJson.write(w, top[i], lp[top[i]], i + 1);
        if (w.full) await w.flush();
      }
      const pending = w.push('}');
      if (pending) await pending;
    }
    await generator.tick(signal);
  }
  w.push(']');
}

/** The completions `logprobs` object for these tokens; `text_offset` starts at `initialOffset` characters. */
export function logprobsJson(tokenizer: Tokenizer, ids: number[], steps: (StepLogprobs | null)[], initialOffset: number): string {
  const tokens: string[] = [];
  const lps: string[] = [];
  const tops: string[] = [];
  const offsets: number[] = [];
  let offset = initialOffset;
  for (let i = 0; i < ids.length; i++) {
    const tok = tokenizer.tokenString(ids[i]);
    tokens.push(JSON.stringify(tok));
    offsets.push(offset);
    offset += codePoints(tok);
    const step = steps[i];
    if (!step) {
      lps.push('null');
      tops.push('null');
      continue;
    }
    lps.push(num(step.logprob));
    // A dict keyed by decoded token: the sampled token first, then the top k; equal strings collapse.
    const map = new Map<string, number>([[tok, step.logprob]]);
    for (const t of step.top) map.set(tokenizer.tokenString(t.id), t.logprob);
    tops.push(`{${[...map].map(([k, v]) => `${JSON.stringify(k)}:${num(v)}`).join(',')}}`);
  }
  return `{"text_offset":[${offsets.join(',')}],"token_logprobs":[${lps.join(',')}],"tokens":[${tokens.join(',')}],"top_logprobs":[${tops.join(',')}]}`;
}

/** Pre-encoded JSON fragments per token id for the full-vocabulary writer, in one blob (few objects to keep). */
export class VocabJson {
  readonly #tokenizer: Tokenizer;
  #blob: Uint8Array | null = null;
  /** For token t: pre = blob[at[2t], at[2t+1]) is `"t":{"logprob":`, post runs on to at[2t+2]. */
  #at: Uint32Array | null = null;

  constructor(tokenizer: Tokenizer) {
    this.#tokenizer = tokenizer;
  }

  #build(): void {
    const V = this.#tokenizer.vocabSize;
    const parts: Buffer[] = [];
    const at = new Uint32Array(2 * V + 1);
    let size = 0;
    for (let t = 0; t < V; t++) {
      const pre = Buffer.from(`"${t}":{"logprob":`);
      const post = Buffer.from(`,"decoded_token":${JSON.stringify(this.#tokenizer.tokenString(t))}}`);
      at[2 * t] = size;
      at[2 * t + 1] = size + pre.length;
      size += pre.length + post.length;
      parts.push(pre, post);
    }
    at[2 * V] = size;
    this.#blob = Buffer.concat(parts);
    this.#at = at;
  }

  /** `"id":{"logprob":x,"rank":r,"decoded_token":"..."}` */
  write(w: BodyWriter, id: number, logprob: number, rank: number): void {
    if (!this.#blob) this.#build();
    const at = this.#at!;
    w.copy(this.#blob!, at[2 * id], at[2 * id + 1]);
    w.logprob(logprob);
    w.copy(RANK, 0, RANK.length);
    w.int(rank);
    w.copy(this.#blob!, at[2 * id + 1], at[2 * id + 2]);
  }
}

const RANK = Buffer.from(',"rank":');

/** Logprobs clamp at -9999 like vLLM's serializer (JSON has no -Infinity). */
function num(x: number): string {
  return x > -9999 ? String(x) : '-9999.0';
}

export function codePoints(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0xdc00 || c > 0xdfff) n++;
  }
  return n;
}
