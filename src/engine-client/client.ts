import { Pool, errors as undiciErrors, type Dispatcher } from 'undici';
import { setTimeout as sleep } from 'node:timers/promises';
import { apiError, ApiError } from '../errors/index.ts';
import { engineErrorToApiError, isRetryable, parseEngineError } from './errors.ts';
import { StreamPoster, StreamPostSocketError, type BodySink } from './stream-post.ts';
import { captureSlabs, SlabBody } from './slab-body.ts';

export interface BackendTarget {
  modelId: string;
  url: string;
  checkpoint: string;
  gpuShape: string;
}

export interface EngineResponse {
  statusCode: number;
  headers: Dispatcher.ResponseData['headers'];
  body: Dispatcher.ResponseData['body'];
  /** Releases the backend's connection slot; call once the body is consumed or abandoned. */
  release(): void;
  /**
   * A capture's body held in pooled slabs (`postCapture` over plain HTTP): ends the body and gives the
   * slabs back. Only once nothing reads the body's chunks any more (the client's response has closed).
   */
  recycle?(): void;
}

export interface EngineClientOptions {
  /** Concurrent upstream requests per backend before the gateway answers 503 wrapper_saturated. */
  maxConnectionsPerBackend?: number;
  /** Extra attempts after a connection failure or a retryable 5xx. */
  retries?: number;
  retryBaseDelayMs?: number;
}

const connectErrorCodes = new Set(['ECONNREFUSED', 'ECONNRESET', 'EHOSTUNREACH', 'ENOTFOUND', 'EAI_AGAIN', 'UND_ERR_CONNECT_TIMEOUT', 'UND_ERR_SOCKET', 'EPIPE']);

class Backend {
  pool: Pool;
  url: URL;
  inflight = 0;
  readonly headers: Record<string, string>;

  constructor(readonly target: BackendTarget, readonly maxConnections: number) {
    this.pool = Backend.#poolFor(target.url, maxConnections);
    this.url = new URL(target.url);
    this.headers = { 'x-svc-upstream-model': target.checkpoint, 'x-svc-upstream-gpu': target.gpuShape };
  }

  static #poolFor(url: string, maxConnections: number): Pool {
    return new Pool(url, {
      connections: maxConnections,
      pipelining: 1,
      // Generations can take the whole request window; our own deadline timer bounds them.
      headersTimeout: 0,
      bodyTimeout: 0,
      keepAliveTimeout: 30_000,
      connectTimeout: 5_000,
    });
  }

  /** Points the backend at a new address (a restarted engine); requests in flight finish on the old pool. */
  retarget(url: string): void {
    const old = this.pool;
    this.pool = Backend.#poolFor(url, this.maxConnections);
    this.url = new URL(url);
    void old.close().catch(() => undefined);
  }
}

/** One undici pool per backend; turns transport and engine failures into catalogue errors. */
export class EngineClient {
  readonly #backends = new Map<string, Backend>();
  readonly #retries: number;
  readonly #retryBaseDelayMs: number;
  readonly #streams = new StreamPoster();

  constructor(targets: BackendTarget[], options: EngineClientOptions = {}) {
    const max = options.maxConnectionsPerBackend ?? 512;
    for (const target of targets) this.#backends.set(target.modelId, new Backend(target, max));
    this.#retries = options.retries ?? 2;
    this.#retryBaseDelayMs = options.retryBaseDelayMs ?? 100;
  }

  /** Sends a model's future requests to a new engine address. */
  retarget(modelId: string, url: string): void {
    this.#backend(modelId).retarget(url);
  }

  /** Headers naming the backend that served or failed a request. */
  upstreamHeaders(modelId: string): Record<string, string> {
    return this.#backend(modelId).headers;
  }

  /**
   * POSTs a JSON body and resolves once a 2xx response's headers arrive. Connection failures and
   * retryable 5xx are retried (nothing has reached the client yet); anything else throws an ApiError.
   */
  async post(modelId: string, path: string, body: string, signal: AbortSignal): Promise<EngineResponse> {
    const backend = this.#backend(modelId);
    const release = this.#slot(backend);
    try {
      return await this.#retrying<EngineResponse>(backend, signal, async () => {
        const response = await backend.pool.request({ method: 'POST', path, body, headers: { 'content-type': 'application/json' }, signal, blocking: true });
        if (response.statusCode < 300) return { answer: { statusCode: response.statusCode, headers: response.headers, body: response.body, release } };
        return { status: response.statusCode, text: await response.body.text() };
      });
    } catch (err) {
      release();
      throw err;
    }
  }

  /**
   * `post` for a capture, whose body the relay holds: over plain HTTP the body is read on connections
   * of the client's own (stream-post.ts) into slabs of a per-process pool (slab-body.ts), reused from
   * one capture to the next, and the response has `recycle`; over HTTPS it is `post`'s. Failures,
   * retries and errors as `post`; a connection that breaks after the head errors the body.
   */
  async postCapture(modelId: string, path: string, body: string, signal: AbortSignal): Promise<EngineResponse> {
    const backend = this.#backend(modelId);
    if (backend.url.protocol !== 'http:') return this.post(modelId, path, body, signal);
    const release = this.#slot(backend);
    try {
      return await this.#retrying<EngineResponse>(backend, signal, async () => {
        const cancel = new AbortController();
        const onAbort = () => cancel.abort(signal.reason);
        if (signal.aborted) onAbort();
        else signal.addEventListener('abort', onAbort, { once: true });
        let length: number | null = null;
        let headed = () => {};
        const answered = new Promise<'head'>((resolve) => (headed = () => resolve('head')));
        const response = new SlabBody(captureSlabs, (contentLength) => {
          length = contentLength;
          headed();
        });
        response.onDestroy = () => cancel.abort(new Error('the body was destroyed'));
        response.on('error', () => {}); // an error before anyone reads the body is theirs to see, not a crash
        const exchange = this.#streams.post(backend.url, path, {}, body, cancel.signal, response.sink);
        exchange.then(
          (result) => (response.destroyed ? undefined : 'complete' in result && result.complete ? response.push(null) : response.destroy()),
          (error: Error) => response.destroy(error),
        );
        exchange.finally(() => signal.removeEventListener('abort', onAbort)).catch(() => {});
        const result = await Promise.race([answered, exchange]);
        if (result !== 'head' && !('complete' in result)) return result;
        const headers = length === null ? {} : { 'content-length': String(length) };
        // The body's type is undici's for every engine response; a capture's is only read as a stream.
        return { answer: { statusCode: 200, headers, body: response as unknown as EngineResponse['body'], release, recycle: () => response.recycle() } };
      });
    } catch (err) {
      release();
      throw err;
    }
  }

  /**
   * POSTs a JSON body and hands a 2xx response's body to `sink` as it is read, for bodies of hundreds of
   * MB: over plain HTTP each piece is a view of the connection's one read buffer, valid only during
   * `sink.chunk` (stream-post.ts); over HTTPS it is undici's. Resolves once the body is read, or stopped
   * by the sink (`complete` false). Failures, retries and errors as `post`.
   */
  async postStreaming(modelId: string, path: string, body: string, signal: AbortSignal, sink: BodySink): Promise<{ complete: boolean }> {
    const backend = this.#backend(modelId);
    if (backend.url.protocol !== 'http:') return this.#postStreamingUndici(modelId, path, body, signal, sink);
    const release = this.#slot(backend);
    try {
      return await this.#retrying<{ complete: boolean }>(backend, signal, async () => {
        const result = await this.#streams.post(backend.url, path, {}, body, signal, sink);
        return 'complete' in result ? { answer: { complete: result.complete } } : result;
      });
    } finally {
      release();
    }
  }

  /**
   * Runs one exchange with the engine until it answers. Connection failures and retryable engine
   * errors are tried again (nothing has reached the client yet); an exchange cut short once answering
   * is thrown as it is; anything else throws an ApiError.
   */
  async #retrying<T>(backend: Backend, signal: AbortSignal, exchange: () => Promise<{ answer: T } | { status: number; text: string }>): Promise<T> {
    for (let attempt = 0; ; attempt++) {
      let outcome: { answer: T } | { status: number; text: string };
      try {
        outcome = await exchange();
      } catch (err) {
        if (signal.aborted || (err as { answered?: boolean }).answered === true) throw err;
        const code = (err as { code?: string }).code ?? '';
        if (!connectErrorCodes.has(code) && !(err instanceof undiciErrors.SocketError) && !(err instanceof StreamPostSocketError)) throw err;
        if (attempt >= this.#retries) throw apiError('upstream_unreachable', 'the model server is unreachable', { headers: backend.headers });
        await sleep(this.#retryBaseDelayMs * 3 ** attempt, undefined, { signal });
        continue;
      }
      if ('answer' in outcome) return outcome.answer;
      const failure = parseEngineError(outcome.status, outcome.text);
      if (!isRetryable(failure) || attempt >= this.#retries) throw engineErrorToApiError(failure, backend.headers);
      await sleep(this.#retryBaseDelayMs * 3 ** attempt, undefined, { signal });
    }
  }

  async #postStreamingUndici(modelId: string, path: string, body: string, signal: AbortSignal, sink: BodySink): Promise<{ complete: boolean }> {
    const response = await this.post(modelId, path, body, signal);
    try {
      const length = Number(response.headers['content-length']);
      sink.head(Number.isSafeInteger(length) ? length : null);
      for await (const chunk of response.body) if (!sink.chunk(chunk as Buffer)) return { complete: false };
      return { complete: true };
    } finally {
      response.release();
    }
  }

  /** Takes one of the backend's connection slots (wrapper_saturated when none is free); returns its release. */
  #slot(backend: Backend): () => void {
    if (backend.inflight >= backend.maxConnections) {
      throw apiError('wrapper_saturated', 'no free upstream connection at the gateway', { headers: backend.headers });
    }
    backend.inflight++;
    let released = false;
    return () => {
      if (!released) {
        released = true;
        backend.inflight--;
      }
    };
  }

  #backend(modelId: string): Backend {
    const backend = this.#backends.get(modelId);
    if (!backend) throw new ApiError('internal_error', 'internal error');
    return backend;
  }

  async close(): Promise<void> {
    this.#streams.close();
    await Promise.all([...this.#backends.values()].map((b) => b.pool.destroy()));
  }
}
