// The reference engine's HTTP face: vLLM's OpenAI-compatible routes (+ vllm-lens extras) on node:http.
import { createServer, type IncomingMessage, type ServerResponse, type Server } from 'node:http';
import type { Socket } from 'node:net';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import type { Generator } from './generate.ts';
import { parseCompletionRequest, type EngineLimits } from './request.ts';
import { Chaos, type ChaosMode } from './chaos.ts';
import { fullCompletion, streamCompletion } from './completions.ts';
import { VocabJson } from './logprobs-json.ts';
import { EngineHttpError, badRequest, notFound, internalError, outOfMemory, engineDead } from './errors.ts';

const MAX_BODY = 256 * 1024 * 1024;

export interface EngineServerOptions {
  generator: Generator;
  checkpoint: string;
  limits: EngineLimits;
  chaos: boolean;
  /** With `chaos`: armed at start for the first completion (the boot knob `--chaos-mode`). */
  chaosMode?: ChaosMode;
  /** Captures sent zstd-compressed (level 1, as vllm-lens does by default) or not (null, the default). */
  captureCompression?: 'zstd' | null;
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
  if (chaos && opts.chaosMode) chaos.configure({ mode: opts.chaosMode });
  const created = Math.floor(Date.now() / 1000);
  const sockets = new Set<Socket>();
  const inflight = new Set<AbortController>();
  // The most generations that ever ran at once: lets a test count concurrency at the engine itself.
  let inflightPeak = 0;
  /** Generations cut short because their client went away (chaos: tests tell a cancel from an end). */
  let cancelled = 0;
  const inflightWaiters = new Set<() => void>();
  const inflightChanged = () => {
    for (const wake of inflightWaiters) wake();
  };
  /** Resolves once exactly `count` generations run: a test waits on the event instead of polling /metrics. */
  const whenRunning = (count: number) =>
    new Promise<void>((resolve) => {
      const wake = () => {
        if (inflight.size !== count) return;
        inflightWaiters.delete(wake);
        resolve();
      };
      inflightWaiters.add(wake);
      wake();
    });
  const completionContext = { generator, checkpoint, vocabJson: new VocabJson(tokenizer), captureCompression: opts.captureCompression ?? null };
  let crashed = false;

  const crash = () => {
    crashed = true;
    if (opts.onCrash) return opts.onCrash();
    for (const s of sockets) s.destroy();
    server.close();
  };

  // Idle keep-alive connections stay open a minute (Node's default is 5 s): a client reusing one just
  // as the server closes it gets a reset, and under load the clients' one-second margin is not enough.
  const server = createServer({ keepAliveTimeout: 65_000 }, (req, res) => {
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
      case 'GET /metrics': {
        // vLLM's Prometheus gauge of requests being generated; a client that leaves is no longer counted.
        const model = `{model_name=${JSON.stringify(checkpoint)}}`;
        const text =
          `# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running${model} ${inflight.size}\n` +
          `# TYPE svc_engine_requests_running_peak gauge\nsvc_engine_requests_running_peak${model} ${inflightPeak}\n`;
        res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4', 'content-length': Buffer.byteLength(text) });
        return void res.end(text);
      }
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
      case 'POST /_chaos/running': {
        if (!chaos) break;
        const count = (await readJson(req)).count;
        if (!Number.isInteger(count) || (count as number) < 0) throw badRequest('count must be a non-negative integer', 'count');
        await whenRunning(count as number);
        return sendJson(res, 200, { running: inflight.size, cancelled });
      }
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
    if (mode === 'tear' && !req.stream) {
      // A body whose headers (and Content-Length) went out, then its first bytes, then the engine dies.
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': 4096 });
      return new Promise<void>((r) => res.write('{"id":"cmpl-torn","object":"text_completion","choi', () => r(crash())));
    }
    const abort = new AbortController();
    inflight.add(abort);
    inflightPeak = Math.max(inflightPeak, inflight.size);
    inflightChanged();
    res.on('close', () => {
      if (res.writableFinished) return;
      cancelled++;
      abort.abort(new Error('client went away'));
    });
    const id = `cmpl-${randomBytes(16).toString('hex')}`;
    // A torn frame reaches the client's socket before the engine dies.
    const tear = () => new Promise<void>((r) => res.write(`data: {"id":"${id}","object":"text_completion","choi`, () => r(crash())));
    const afterToken =
      mode === 'delay'
        ? // A sleep, not work: a generation cancelled meanwhile (its client went away) ends at once, not a delay later.
          () => sleep(chaos!.delayMs, undefined, { signal: abort.signal }).catch(() => {})
        : mode === 'crash'
          ? () => crash()
          : mode === 'tear'
            ? tear
            : undefined;
    try {
      if (req.stream) await streamCompletion(completionContext, req, res, id, abort.signal, afterToken);
      else await fullCompletion(completionContext, req, res, id, abort.signal, afterToken);
    } finally {
      inflight.delete(abort);
      inflightChanged();
    }
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
