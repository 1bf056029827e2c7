// The reference engine's HTTP face: vLLM's OpenAI-compatible routes (+ vllm-lens extras) on node:http.
import { createServer, type IncomingMessage, type ServerResponse, type Server } from 'node:http';
import type { Socket } from 'node:net';
import { randomBytes } from 'node:crypto';
import type { Tokenizer } from '../tokenizer/index.ts';
import { encodeTensor } from '../codec/index.ts';
import type { Generator, PromptRun, StepLogprobs, TokenEvent } from './generate.ts';
import { stepLogprobs } from './generate.ts';
import { parseCompletionRequest, type CompletionRequest, type EngineLimits } from './request.ts';
import { Ranker, rankOf, topK } from './sampling.ts';
import { BodyWriter } from './body-writer.ts';
import { Chaos } from './chaos.ts';
import { EngineHttpError, badRequest, notFound, internalError, outOfMemory, engineDead } from './errors.ts';

const MAX_BODY = 256 * 1024 * 1024;

export interface EngineServerOptions {
  generator: Generator;
  checkpoint: string;
  limits: EngineLimits;
  chaos: boolean;
  /** What a `crash` chaos does: the CLI exits the process; in-process engines drop every connection. */
  onCrash?: () => void;
}

export interface EngineServer {
  server: Server;
  close(): Promise<void>;
}

export function createEngineServer(opts: EngineServerOptions): EngineServer {
  const { generator, checkpoint, limits } = opts;
  const tokenizer = generator.tokenizer;
  const chaos = opts.chaos ? new Chaos() : null;
  const created = Math.floor(Date.now() / 1000);
  const sockets = new Set<Socket>();
  const inflight = new Set<AbortController>();
  const vocabJson = new VocabJson(tokenizer);
  let crashed = false;

  const crash = () => {
    crashed = true;
    if (opts.onCrash) return opts.onCrash();
    for (const s of sockets) s.destroy();
    server.close();
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      const e = err instanceof EngineHttpError ? err : internalError((err as Error)?.message ?? String(err));
      if (!res.headersSent) sendError(res, e);
      else res.destroy();
    });
  });
  server.on('connection', (s) => {
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    if (crashed) return void res.destroy();
    const path = (req.url ?? '/').split('?')[0];
    const route = `${req.method} ${path}`;
    switch (route) {
      case 'GET /health':
        res.writeHead(chaos?.dead ? 503 : 200, { 'content-length': 0 });
        return void res.end();
      case 'GET /version':
        return sendJson(res, 200, { version: 'reference' });
      case 'GET /v1/models':
        return sendJson(res, 200, {
          object: 'list',
          data: [{ id: checkpoint, object: 'model', created, owned_by: 'vllm', root: checkpoint, parent: null, max_model_len: limits.maxModelLen, permission: [] }],
        });
      case 'POST /tokenize': {
        const body = await readJson(req);
        checkModel(body);
        if (typeof body.prompt !== 'string') throw badRequest('prompt must be a string', 'prompt');
        const add = body.add_special_tokens ?? true;
        if (typeof add !== 'boolean') throw badRequest('add_special_tokens must be a boolean', 'add_special_tokens');
        const tokens = tokenizer.encode(body.prompt, add);
        const strs = body.return_token_strs === true ? tokens.map((t) => tokenizer.tokenPiece(t)) : null;
        return sendJson(res, 200, { count: tokens.length, max_model_len: limits.maxModelLen, tokens, token_strs: strs });
      }
      case 'POST /detokenize': {
        const body = await readJson(req);
        checkModel(body);
        const ids = body.tokens;
        if (!Array.isArray(ids) || !ids.every((t) => Number.isInteger(t) && t >= 0 && t < tokenizer.vocabSize)) {
          throw badRequest(`tokens must be a list of token ids in 0..${tokenizer.vocabSize - 1}`, 'tokens');
        }
        return sendJson(res, 200, { prompt: tokenizer.decode(ids as number[]) });
      }
      case 'POST /v1/completions':
        return completions(req, res);
      case 'POST /_chaos':
        if (chaos) return sendJson(res, 200, chaos.configure(await readJson(req)));
        break;
    }
    sendJson(res, 404, { detail: 'Not Found' });
  }

  function checkModel(body: Record<string, unknown>): void {
    const m = body.model;
    if (m !== undefined && m !== null && m !== checkpoint) throw notFound(`The model \`${String(m)}\` does not exist.`);
  }

  async function completions(httpReq: IncomingMessage, res: ServerResponse): Promise<void> {
    const body = await readJson(httpReq);
    checkModel(body);
    const req = parseCompletionRequest(body, tokenizer, limits);
    const mode = chaos?.take() ?? 'none';
    if (mode === 'error500') throw internalError('Internal server error (reference engine: simulated)');
    if (mode === 'oom') throw outOfMemory();
    if (mode === 'dead') throw engineDead();
    if (mode === 'hang') return; // never answered; the socket closes with the server
    const abort = new AbortController();
    inflight.add(abort);
    res.on('close', () => {
      if (!res.writableFinished) abort.abort(new Error('client went away'));
    });
    const afterToken =
      mode === 'delay' ? () => new Promise<void>((r) => setTimeout(r, chaos!.delayMs)) : mode === 'crash' ? () => crash() : undefined;
    const id = `cmpl-${randomBytes(16).toString('hex')}`;
    try {
      if (req.stream) await streamCompletion(req, res, id, abort.signal, afterToken);
      else await fullCompletion(req, res, id, abort.signal, afterToken);
    } finally {
      inflight.delete(abort);
    }
  }

  function echoText(req: CompletionRequest, p: number): string {
    return req.echo ? (req.promptTexts[p] ?? tokenizer.decode(req.prompts[p])) : '';
  }

  async function fullCompletion(req: CompletionRequest, res: ServerResponse, id: string, signal: AbortSignal, afterToken?: () => unknown): Promise<void> {
    const runs: PromptRun[] = [];
    for (let p = 0; p < req.prompts.length; p++) runs.push(await generator.runPrompt(req, p, { signal, afterToken: afterToken as never }));
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
      const echo = echoText(req, p);
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
          logprobs = logprobsJson(ids, steps, 0);
        }
        w.push(
          `${first ? '' : ','}{"index":${p * req.n + c.choice},"text":${JSON.stringify(echo + c.text)},"logprobs":${logprobs},"finish_reason":"${c.finishReason}","stop_reason":${JSON.stringify(c.stopReason)},"prompt_logprobs":`,
        );
        first = false;
        if (req.promptLogprobs === null) w.push('null');
        else await writePromptLogprobs(w, run.promptHidden!, prompt, req.promptLogprobs, signal);
        w.push('}');
      }
    }
    w.push(`],"usage":{"prompt_tokens":${promptTokens},"total_tokens":${promptTokens + completionTokens},"completion_tokens":${completionTokens}}`);
    const cap = runs[0]?.capture;
    if (cap) w.push(`,"activations":{"residual_stream":${JSON.stringify(encodeTensor(cap.values, cap.shape, 'bfloat16'))}}`);
    w.push('}');
    await w.end();
  }

  async function writePromptLogprobs(w: BodyWriter, hidden: Float32Array, prompt: number[], k: number, signal: AbortSignal): Promise<void> {
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
        }
        const pending = w.push('}');
        if (pending) await pending;
      }
      await generator.tick(signal);
    }
    w.push(']');
  }

  function logprobsJson(ids: number[], steps: (StepLogprobs | null)[], initialOffset: number): string {
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

  async function streamCompletion(req: CompletionRequest, res: ServerResponse, id: string, signal: AbortSignal, afterToken?: () => unknown): Promise<void> {
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
        const echo = echoText(req, p);
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
              ? logprobsJson([...promptIds, ev.token], [...promptSteps, ev.logprobs], 0)
              : logprobsJson([ev.token], [ev.logprobs], sent[ev.choice] + codePoints(prefix))
            : 'null';
          sent[ev.choice] += codePoints(text);
          const usage = req.continuousUsage
            ? `{"prompt_tokens":${promptLen},"total_tokens":${promptLen + ev.completionTokens},"completion_tokens":${ev.completionTokens}}`
            : 'null';
          const choice = `{"index":${p * req.n + ev.choice},"text":${JSON.stringify(text)},"logprobs":${lp},"finish_reason":${ev.finishReason ? `"${ev.finishReason}"` : 'null'},"stop_reason":${JSON.stringify(ev.stopReason)}}`;
          w.push(`data: ${head}${choice}],"usage":${usage}}\n\n`);
          return w.flush();
        };
        await generator.runPrompt(req, p, { signal, onToken, onPrefill, afterToken: afterToken as never });
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

  return {
    server,
    close: async () => {
      for (const a of inflight) a.abort(new Error('engine shutting down'));
      const closed = new Promise<void>((r) => server.close(() => r()));
      for (const s of sockets) s.destroy();
      await closed;
    },
  };
}

/** Pre-encoded JSON fragments per token id for the full-vocabulary writer, in one blob (few objects to keep). */
class VocabJson {
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

function codePoints(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0xdc00 || c > 0xdfff) n++;
  }
  return n;
}

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

function sendError(res: ServerResponse, e: EngineHttpError): void {
  const text = e.body();
  res.writeHead(e.status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
}

async function readJson(req: IncomingMessage): Promise<Record<string, unknown>> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY) throw badRequest('request body is too large');
    chunks.push(chunk as Buffer);
  }
  let body: unknown;
  try {
    body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
  } catch (err) {
    throw badRequest(`JSON decode error: ${(err as Error).message}`);
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body)) throw badRequest('request body must be a JSON object');
  return body as Record<string, unknown>;
}
