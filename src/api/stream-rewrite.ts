/**
 * The two places where a completion stream must differ from what a vLLM engine sends, per the contract:
 *
 * - `text_offset` in byte offsets into the choice's text (logprobs-offsets.ts), frame by frame;
 * - `prompt_logprobs: 0` on a stream. The contract allows 0 with `stream` true and says a choice's
 *   `prompt_logprobs` is present when it was set, but vLLM accepts it on a stream and never sends it
 *   (its stream frames have no such field). So the gateway asks the engine for them on the side, once,
 *   with the same prompt, model, steering and special-token setting, not streamed and one token long,
 *   and puts them into the first content frame of each choice, as the engine produced them. A failure
 *   of that call ends the stream with the contract's mid-stream error frame. The side call's prompt
 *   pass is the gateway's cost, not metered to the key.
 *
 * Frames are rewritten whole; every other frame, and every other byte of a rewritten one, goes through
 * as the engine wrote it.
 */
import { Transform, type TransformCallback } from 'node:stream';
import type { EngineClient, EngineResponse } from '../engine-client/index.ts';
import type { PreparedCompletion } from '../completion-request/index.ts';
import { apiError, ApiError } from '../errors/index.ts';
import { ChoiceOffsets, withByteOffsets } from './logprobs-offsets.ts';

export interface StreamRewriteOptions {
  engines: Pick<EngineClient, 'post'>;
  modelId: string;
  requestId: string;
  upstreamHeaders: Record<string, string>;
  /** The client's request: aborting it cancels the side call. */
  signal: AbortSignal;
}

/** Largest non-streamed body whose offsets are rewritten: it is parsed whole (long prompt_logprobs make bodies of hundreds of MB). */
export const largestRewrittenBodyBytes = 32 * 1024 * 1024;

/**
 * True when the engine's `text_offset` must be rewritten: logprobs asked for, on a body that can be
 * parsed (not a full-vocabulary or capture body, nor one whose `contentLength` is over the bound).
 */
export function needsByteOffsets(completion: PreparedCompletion, contentLength?: number): boolean {
  if (contentLength !== undefined && contentLength > largestRewrittenBodyBytes) return false;
  return completion.engineBody.logprobs != null && !completion.fullVocab && !completion.capture;
}

/** A stream whose client asked for `prompt_logprobs: 0`, which a vLLM stream never carries. */
export function needsStreamPromptLogprobs(completion: PreparedCompletion): boolean {
  return completion.stream && completion.engineBody.prompt_logprobs === 0;
}

/**
 * The engine's streamed response with its body rewritten where the contract needs it (the response
 * itself when nothing needs to change). The rewritten body fails when the engine's does, and letting
 * it go lets the engine's go.
 */
export function rewriteEngineStream(upstream: EngineResponse, completion: PreparedCompletion, options: StreamRewriteOptions): EngineResponse {
  const offsets = needsByteOffsets(completion);
  const promptLogprobs = needsStreamPromptLogprobs(completion) ? askPromptLogprobs(completion, options) : null;
  if (!offsets && !promptLogprobs) return upstream;
  const body = upstream.body;
  const rewriter = new SseFrameRewriter(completion.n, offsets, promptLogprobs, options);
  body.once('error', (err) => rewriter.destroy(err));
  rewriter.once('close', () => body.destroy());
  body.pipe(rewriter);
  return { ...upstream, body: rewriter as unknown as EngineResponse['body'] };
}

/** A whole completion body with byte offsets when the request asked for logprobs; the same buffer otherwise. */
export function bodyWithByteOffsets(body: Buffer, completion: PreparedCompletion): Buffer {
  if (!needsByteOffsets(completion)) return body;
  const json = body.toString('utf8');
  const rewritten = withByteOffsets(json);
  return rewritten === json ? body : Buffer.from(rewritten);
}

/** Each prompt's `prompt_logprobs` as the engine produces them, from one non-streamed call of one token per prompt. */
function askPromptLogprobs(completion: PreparedCompletion, options: StreamRewriteOptions): Promise<unknown[]> {
  const { stream_options: _streamOptions, ...rest } = completion.engineBody;
  const side = { ...rest, stream: false, n: 1, max_tokens: 1, logprobs: null, echo: false, stop: null, prompt_logprobs: 0 };
  const answer = (async () => {
    const res = await options.engines.post(options.modelId, '/v1/completions', JSON.stringify(side), options.signal);
    try {
      const parsed = (await res.body.json()) as { choices?: { index?: number; prompt_logprobs?: unknown }[] };
      const byPrompt: unknown[] = [];
      for (const choice of parsed.choices ?? []) byPrompt[choice.index ?? byPrompt.length] = choice.prompt_logprobs ?? null;
      return byPrompt;
    } finally {
      res.release();
    }
  })();
  answer.catch(() => {}); // awaited by the first content frame; a stream that ends first never asks
  return answer;
}

const frameEnd = Buffer.from('\n\n');
const dataPrefix = 'data: ';

class SseFrameRewriter extends Transform {
  readonly #n: number;
  readonly #offsets: Map<number, ChoiceOffsets> | null;
  readonly #promptLogprobs: Promise<unknown[]> | null;
  readonly #given = new Set<number>();
  readonly #options: StreamRewriteOptions;
  #partial: Buffer | null = null;
  #failed = false;

  constructor(n: number, offsets: boolean, promptLogprobs: Promise<unknown[]> | null, options: StreamRewriteOptions) {
    super();
    this.#n = n;
    this.#offsets = offsets ? new Map() : null;
    this.#promptLogprobs = promptLogprobs;
    this.#options = options;
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    if (this.#failed) return callback();
    const data = this.#partial ? Buffer.concat([this.#partial, chunk]) : chunk;
    this.#partial = null;
    const frames: string[] = [];
    let start = 0;
    for (let end = data.indexOf(frameEnd); end >= 0; end = data.indexOf(frameEnd, start)) {
      frames.push(data.toString('utf8', start, end));
      start = end + 2;
    }
    if (start < data.length) this.#partial = data.subarray(start);
    this.#rewrite(frames).then(
      (out) => callback(null, out.length > 0 ? out : undefined),
      (err) => {
        // The side call failed: the contract's mid-stream error, then the end; the engine's body is let go.
        this.#failed = true;
        const error = err instanceof ApiError ? err : apiError('upstream_unreachable', 'the model server did not return the prompt logprobs', { headers: this.#options.upstreamHeaders });
        this.push(`data: ${JSON.stringify(error.body(this.#options.requestId))}\n\ndata: [DONE]\n\n`);
        this.push(null);
        callback();
      },
    );
  }

  override _flush(callback: TransformCallback): void {
    // An unterminated last frame goes on as it came: the relay after this one drops it.
    if (this.#partial && !this.#failed) this.push(this.#partial);
    this.#partial = null;
    callback();
  }

  async #rewrite(frames: string[]): Promise<string> {
    let out = '';
    for (const frame of frames) out += `${await this.#frame(frame)}\n\n`;
    return out;
  }

  async #frame(frame: string): Promise<string> {
    if (!frame.startsWith(dataPrefix) || frame.startsWith('data: [DONE]')) return frame;
    let json = frame.slice(dataPrefix.length);
    if (this.#offsets && json.includes('"text_offset"')) json = withByteOffsets(json, this.#offsets);
    if (this.#promptLogprobs) json = await this.#withPromptLogprobs(json);
    return dataPrefix + json;
  }

  /** The first content frame of each choice gets its prompt's `prompt_logprobs` (unless the engine sent them). */
  async #withPromptLogprobs(json: string): Promise<string> {
    let parsed: { choices?: { index?: number; prompt_logprobs?: unknown }[] };
    try {
      parsed = JSON.parse(json);
    } catch {
      return json;
    }
    const choices = Array.isArray(parsed?.choices) ? parsed.choices : [];
    const fresh = choices.filter((c) => typeof c?.index === 'number' && !this.#given.has(c.index));
    if (fresh.length === 0) return json;
    const byPrompt = await this.#promptLogprobs!;
    for (const choice of fresh) {
      this.#given.add(choice.index!);
      if (choice.prompt_logprobs == null) choice.prompt_logprobs = byPrompt[Math.floor(choice.index! / this.#n)] ?? null;
    }
    // One choice per frame (vLLM's way): the field goes in after its `{`, the rest stays as it came.
    const at = json.indexOf('"choices":[{');
    if (choices.length === 1 && at >= 0 && !json.slice(at).includes('"prompt_logprobs"')) {
      const open = at + '"choices":[{'.length;
      return `${json.slice(0, open)}"prompt_logprobs":${JSON.stringify(choices[0].prompt_logprobs)},${json.slice(open)}`;
    }
    return JSON.stringify(parsed);
  }
}
