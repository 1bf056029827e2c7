// /v1/completions responses: the non-streaming object and the SSE stream, both written with backpressure.
import type { ServerResponse } from 'node:http';
import type { Tokenizer } from '../tokenizer/index.ts';
import { encodeTensor, encodeTensorZstdSync } from '../codec/index.ts';
import type { Generator, PromptRun, StepLogprobs, TokenEvent } from './generate.ts';
import { stepLogprobs } from './generate.ts';
import type { CompletionRequest } from './request.ts';
import { BodyWriter } from './body-writer.ts';
import { EngineHttpError, internalError } from './errors.ts';
import { VocabJson, codePoints, logprobsJson, writePromptLogprobs } from './logprobs-json.ts';

export interface CompletionContext {
  generator: Generator;
  /** The checkpoint name responses carry in `model`. */
  checkpoint: string;
  vocabJson: VocabJson;
  /** "zstd": captures go as one zstd frame (level 1) before base64, as vllm-lens sends them by default. */
  captureCompression?: 'zstd' | null;
}

function echoText(tokenizer: Tokenizer, req: CompletionRequest, p: number): string {
  return req.echo ? (req.promptTexts[p] ?? tokenizer.decode(req.prompts[p])) : '';
}

/** A non-streaming `text_completion`, written piece by piece once every choice is generated. */
export async function fullCompletion(ctx: CompletionContext, req: CompletionRequest, res: ServerResponse, id: string, signal: AbortSignal, afterToken?: () => unknown): Promise<void> {
  const { generator, checkpoint, vocabJson } = ctx;
  const tokenizer = generator.tokenizer;
  const runs: PromptRun[] = [];
  for (let p = 0; p < req.prompts.length; p++) runs.push(await generator.runPrompt(req, p, { signal, afterToken }));
  if (signal.aborted) return;
  const w = new BodyWriter(res, { status: 200, headers: { 'content-type': 'application/json' } });
  w.push(`{"id":"${id}","object":"text_completion","created":${Math.floor(Date.now() / 1000)},"model":${JSON.stringify(checkpoint)},"choices":[`);
  let promptTokens = 0;
  let completionTokens = 0;
  let first = true;
  for (let p = 0; p < runs.length; p++) {
    const run = runs[p];
    const prompt = req.prompts[p];
    promptTokens += prompt.length;
    const echo = echoText(tokenizer, req, p);
    for (const c of run.choices) {
      completionTokens += c.tokens.length;
      let logprobs = 'null';
      if (c.steps) {
        const steps: (StepLogprobs | null)[] = [];
        const ids: number[] = [];
        if (req.echo) {
          steps.push(null);
          ids.push(prompt[0]);
          const lp = new Float32Array(tokenizer.vocabSize);
          for (let j = 1; j < prompt.length; j++) {
            generator.promptLogprobsAt(run.promptHidden!, j, lp);
            steps.push(stepLogprobs(lp, prompt[j], req.logprobs!));
            ids.push(prompt[j]);
          }
        }
        steps.push(...c.steps);
        ids.push(...c.tokens);
        logprobs = logprobsJson(tokenizer, ids, steps, 0);
      }
      w.push(
        `${first ? '' : ','}{"index":${p * req.n + c.choice},"text":${JSON.stringify(echo + c.text)},"logprobs":${logprobs},"finish_reason":"${c.finishReason}","stop_reason":${JSON.stringify(c.stopReason)},"prompt_logprobs":`,
      );
      first = false;
      if (req.promptLogprobs === null) w.push('null');
      else await writePromptLogprobs(w, generator, vocabJson, run.promptHidden!, prompt, req.promptLogprobs, signal);
      w.push('}');
    }
  }
  w.push(`],"usage":{"prompt_tokens":${promptTokens},"total_tokens":${promptTokens + completionTokens},"completion_tokens":${completionTokens}}`);
  const cap = runs[0]?.capture;
  if (cap) {
    const tensor = ctx.captureCompression === 'zstd' ? encodeTensorZstdSync(cap.values, cap.shape, 'bfloat16') : encodeTensor(cap.values, cap.shape, 'bfloat16');
    w.push(`,"activations":{"residual_stream":${JSON.stringify(tensor)}}`);
  }
  w.push('}');
  await w.end();
}

/** An SSE completion: one frame per token, the usage frame when asked, then `[DONE]`. */
export async function streamCompletion(ctx: CompletionContext, req: CompletionRequest, res: ServerResponse, id: string, signal: AbortSignal, afterToken?: () => unknown): Promise<void> {
  const { generator, checkpoint } = ctx;
  const tokenizer = generator.tokenizer;
  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', connection: 'keep-alive' });
  const w = new BodyWriter(res);
  const createdAt = Math.floor(Date.now() / 1000);
  const head = `{"id":"${id}","object":"text_completion","created":${createdAt},"model":${JSON.stringify(checkpoint)},"choices":[`;
  let promptTokens = 0;
  let completionTokens = 0;
  try {
    for (let p = 0; p < req.prompts.length; p++) {
      const promptLen = req.prompts[p].length;
      promptTokens += promptLen;
      const echo = echoText(tokenizer, req, p);
      const sent = new Array<number>(req.n).fill(0);
      // echo with logprobs: the first frame of each choice also carries the prompt tokens' entries (vLLM).
      let promptIds: number[] = [];
      let promptSteps: (StepLogprobs | null)[] = [];
      const onPrefill = (hidden: Float32Array | null) => {
        if (!(req.echo && req.logprobs !== null && hidden)) return;
        const prompt = req.prompts[p];
        const lp = new Float32Array(tokenizer.vocabSize);
        promptIds = prompt.slice();
        promptSteps = [null];
        for (let j = 1; j < prompt.length; j++) {
          generator.promptLogprobsAt(hidden, j, lp);
          promptSteps.push(stepLogprobs(lp, prompt[j], req.logprobs));
        }
      };
      const onToken = (ev: TokenEvent) => {
        completionTokens++;
        const first = ev.completionTokens === 1;
        const prefix = first ? echo : '';
        const text = prefix + ev.delta;
        // text_offset counts characters (code points, as Python's len) already sent for this choice.
        const lp = ev.logprobs
          ? first && promptSteps.length > 0
            ? logprobsJson(tokenizer, [...promptIds, ev.token], [...promptSteps, ev.logprobs], 0)
            : logprobsJson(tokenizer, [ev.token], [ev.logprobs], sent[ev.choice] + codePoints(prefix))
          : 'null';
        sent[ev.choice] += codePoints(text);
        const usage = req.continuousUsage
          ? `{"prompt_tokens":${promptLen},"total_tokens":${promptLen + ev.completionTokens},"completion_tokens":${ev.completionTokens}}`
          : 'null';
        const choice = `{"index":${p * req.n + ev.choice},"text":${JSON.stringify(text)},"logprobs":${lp},"finish_reason":${ev.finishReason ? `"${ev.finishReason}"` : 'null'},"stop_reason":${JSON.stringify(ev.stopReason)}}`;
        w.push(`data: ${head}${choice}],"usage":${usage}}\n\n`);
        return w.flush();
      };
      await generator.runPrompt(req, p, { signal, onToken, onPrefill, afterToken });
    }
    if (req.includeUsage) {
      w.push(`data: ${head}],"usage":{"prompt_tokens":${promptTokens},"total_tokens":${promptTokens + completionTokens},"completion_tokens":${completionTokens}}}\n\n`);
    }
  } catch (err) {
    if (signal.aborted || res.destroyed) return;
    const e = err instanceof EngineHttpError ? err : internalError((err as Error)?.message ?? String(err));
    w.push(`data: ${e.body()}\n\n`);
  }
  w.push('data: [DONE]\n\n');
  await w.end();
}
