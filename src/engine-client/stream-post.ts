// A plain-HTTP/1.1 POST whose response body is handed on as it is read, for bodies of hundreds of MB
// (a harvest's captures). Each connection reads into one buffer of its own, reused for every read
// (net's `onread`): no allocation per read, where a socket read into a new 64 KiB ArrayBuffer each
// time made V8 collect the whole heap every ~40 MB received (external memory pressure). So a piece of
// the body is valid only while the sink's `chunk` runs. Connections are kept alive per origin.
import { connect, type Socket } from 'node:net';

/** Takes a 2xx response's body as it arrives. */
export interface BodySink {
  /** The body begins; its length when the response declares it. */
  head(contentLength: number | null): void;
  /** A piece of the body, valid only during the call; false stops reading (the connection is closed). */
  chunk(piece: Uint8Array): boolean;
  /** Given, when the exchange starts, the connection's reading: paused, the rest of the current read still comes. */
  flow?(reading: { pause(): void; resume(): void }): void;
}

export type StreamPostResult = { status: number; complete: boolean } | { status: number; text: string };

/** Bytes each connection reads into. */
const READ_BUFFER = 256 * 1024;
/** Longest response head, and longest error body kept. */
const HEAD_LIMIT = 64 * 1024;
const ERROR_TEXT_LIMIT = 1 << 20;
/** An idle connection is closed after this long. */
const IDLE_MS = 30_000;

/** A failure of the exchange itself: the connection closed early or timed out connecting, or the response is not HTTP/1.x. */
export class StreamPostSocketError extends Error {
  override name = 'StreamPostSocketError';
  constructor(
    message: string,
    readonly code: string,
  ) {
    super(message);
  }
}

interface Exchange {
  onBytes(piece: Buffer): void;
  onEnd(error: Error | null): void;
}

class Connection {
  readonly socket: Socket;
  exchange: Exchange | null = null;
  /** The idle list it waits in, if any. */
  idleIn: Connection[] | null = null;

  constructor(host: string, port: number, connectTimeoutMs: number) {
    const buffer = Buffer.allocUnsafe(READ_BUFFER);
    this.socket = connect({ host, port, noDelay: true, onread: { buffer, callback: (n: number, buf: Uint8Array) => this.#read(n, buf) } });
    // One timer: the connect's, then an idle connection's.
    this.socket.setTimeout(connectTimeoutMs);
    this.socket.on('timeout', () => this.socket.destroy(this.idleIn === null ? new StreamPostSocketError('connect timeout', 'UND_ERR_CONNECT_TIMEOUT') : undefined));
    this.socket.once('connect', () => this.socket.setTimeout(0));
    this.socket.on('error', (error) => this.#end(error));
    this.socket.on('close', () => {
      this.take();
      this.#end(new StreamPostSocketError('the connection closed', 'UND_ERR_SOCKET'));
    });
  }

  /** Out of its idle list, to be used (or because it closed). */
  take(): this {
    const list = this.idleIn;
    this.idleIn = null;
    if (list !== null) list.splice(list.indexOf(this), 1);
    this.socket.setTimeout(0);
    this.socket.ref();
    return this;
  }

  /** Into `list`, closed if unused for IDLE_MS. */
  rest(list: Connection[]): void {
    this.socket.resume(); // read while idle: its close is seen
    this.idleIn = list;
    list.push(this);
    this.socket.setTimeout(IDLE_MS);
    this.socket.unref();
  }

  #read(n: number, buf: Uint8Array): boolean {
    const piece = Buffer.from(buf.buffer, buf.byteOffset, n);
    if (this.exchange === null) this.socket.destroy(); // bytes nobody asked for
    else this.exchange.onBytes(piece);
    return true;
  }

  #end(error: Error): void {
    const exchange = this.exchange;
    this.exchange = null;
    exchange?.onEnd(error);
  }
}

/** Reads a response's head, then its body by Content-Length, chunked coding or to the connection's end. */
class ResponseReader {
  status = 0;
  #head = '';
  #inBody = false;
  #length: number | null = null; // bytes of body (or of the current chunk) left; null: to the end
  #chunked = false;
  #chunkLine = '';
  #chunkState: 'size' | 'data' | 'crlf' | 'trailer' = 'size';
  #trailer = '';
  keepAlive = true;
  done = false;
  #text = '';

  constructor(
    readonly sink: BodySink,
    readonly onDone: () => void,
    readonly stop: () => void,
  ) {}

  /** The error body of a status of 300 or more (bounded). */
  get text(): string {
    return this.#text;
  }

  push(piece: Buffer): void {
    let at = 0;
    while (at < piece.length && !this.done) {
      if (!this.#inBody) at = this.#readHead(piece, at);
      else if (this.#chunked) at = this.#readChunked(piece, at);
      else {
        const take = this.#length === null ? piece.length - at : Math.min(this.#length, piece.length - at);
        if (!this.#body(piece.subarray(at, at + take))) return;
        at += take;
        if (this.#length !== null) {
          this.#length -= take;
          if (this.#length === 0) this.#finish();
        }
      }
    }
    if (at < piece.length && this.done) this.keepAlive = false; // bytes after the response
  }

  /** The connection ended: a body read to its end is complete. */
  end(): boolean {
    if (this.#inBody && this.#length === null && !this.#chunked && !this.done) {
      this.keepAlive = false;
      this.#finish();
    }
    return this.done;
  }

  #readHead(piece: Buffer, at: number): number {
    const before = this.#head.length;
    this.#head += piece.toString('latin1', at, Math.min(piece.length, at + HEAD_LIMIT));
    const end = this.#head.indexOf('\r\n\r\n');
    if (end < 0) {
      if (this.#head.length >= HEAD_LIMIT) throw new StreamPostSocketError('the response head is too long', 'UND_ERR_HEADERS_OVERFLOW');
      return piece.length;
    }
    const lines = this.#head.slice(0, end).split('\r\n');
    const used = at + end + 4 - before;
    const status = /^HTTP\/1\.[01] (\d{3})/.exec(lines[0]);
    if (!status) throw new StreamPostSocketError('the response is not HTTP/1.x', 'UND_ERR_SOCKET');
    const code = Number(status[1]);
    if (code >= 100 && code < 200) {
      this.#head = ''; // an interim response: the real one follows
      return used;
    }
    this.status = code;
    const headers = new Map<string, string>();
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(':');
      if (colon > 0) headers.set(line.slice(0, colon).trim().toLowerCase(), line.slice(colon + 1).trim());
    }
    if (/\bclose\b/i.test(headers.get('connection') ?? '') || lines[0].startsWith('HTTP/1.0')) this.keepAlive = false;
    this.#chunked = /\bchunked\b/i.test(headers.get('transfer-encoding') ?? '');
    const length = headers.get('content-length');
    this.#length = this.#chunked ? 0 : length !== undefined && /^\d+$/.test(length) ? Number(length) : null;
    if (!this.#chunked && this.#length === null) this.keepAlive = false;
    this.#inBody = true;
    if (code < 300) this.sink.head(this.#chunked ? null : this.#length);
    if (!this.#chunked && this.#length === 0) this.#finish();
    return used;
  }

  #readChunked(piece: Buffer, at: number): number {
    if (this.#chunkState === 'data') {
      const take = Math.min(this.#length!, piece.length - at);
      if (!this.#body(piece.subarray(at, at + take))) return piece.length;
      this.#length! -= take;
      if (this.#length === 0) this.#chunkState = 'crlf';
      return at + take;
    }
    const newline = piece.indexOf(0x0a, at);
    const stop = newline < 0 ? piece.length : newline + 1;
    const text = piece.toString('latin1', at, stop);
    if (this.#chunkState === 'crlf') {
      if (newline >= 0) this.#chunkState = 'size';
      return stop;
    }
    if (this.#chunkState === 'size') {
      this.#chunkLine += text;
      if (this.#chunkLine.length > 1024) throw new StreamPostSocketError('a chunk size line is too long', 'UND_ERR_SOCKET');
      if (newline < 0) return stop;
      const size = parseInt(this.#chunkLine, 16);
      this.#chunkLine = '';
      if (!Number.isFinite(size) || size < 0) throw new StreamPostSocketError('a chunk size is not hexadecimal', 'UND_ERR_SOCKET');
      if (size === 0) this.#chunkState = 'trailer';
      else {
        this.#length = size;
        this.#chunkState = 'data';
      }
      return stop;
    }
    // trailer lines until an empty one
    this.#trailer += text;
    if (newline < 0) return stop;
    if (this.#trailer === '\r\n' || this.#trailer === '\n') this.#finish();
    this.#trailer = '';
    return stop;
  }

  #body(piece: Buffer): boolean {
    if (piece.length === 0) return true;
    if (this.status >= 300) {
      if (this.#text.length < ERROR_TEXT_LIMIT) this.#text += piece.toString('utf8');
      return true;
    }
    if (this.sink.chunk(piece)) return true;
    this.keepAlive = false;
    this.done = true;
    this.stop();
    return false;
  }

  #finish(): void {
    this.done = true;
    this.onDone();
  }
}

/** Kept-alive connections per origin; one request at a time on each. */
export class StreamPoster {
  readonly #idle = new Map<string, Connection[]>();
  readonly #connectTimeoutMs: number;

  constructor({ connectTimeoutMs = 5_000 }: { connectTimeoutMs?: number } = {}) {
    this.#connectTimeoutMs = connectTimeoutMs;
  }

  /**
   * POSTs `body` (JSON) to `url` (http:) + `path`. A 2xx response's body goes to `sink` as it arrives
   * (complete false when the sink stopped it); another status resolves with its body's text. A connection
   * that fails throws its error (StreamPostSocketError, or the system's), with `answered` saying whether
   * the response had begun; one that fails before answering on a kept-alive connection (gone stale) is
   * tried once more on a fresh one. An abort throws the signal's reason.
   */
  async post(url: URL, path: string, headers: Record<string, string>, body: string, signal: AbortSignal, sink: BodySink): Promise<StreamPostResult> {
    const origin = `${url.hostname}:${url.port || 80}`;
    for (;;) {
      const reused = this.#idle.get(origin)?.at(-1)?.take();
      const connection = reused ?? new Connection(url.hostname, Number(url.port || 80), this.#connectTimeoutMs);
      try {
        return await this.#exchange(origin, connection, path, url.host, headers, body, signal, sink);
      } catch (error) {
        if (reused !== undefined && (error as { answered?: boolean }).answered === false && !signal.aborted) continue;
        throw error;
      }
    }
  }

  #exchange(origin: string, connection: Connection, path: string, host: string, headers: Record<string, string>, body: string, signal: AbortSignal, sink: BodySink): Promise<StreamPostResult> {
    const { socket } = connection;
    return new Promise<StreamPostResult>((resolve, reject) => {
      let answered = false;
      let settled = false;
      const settle = (error: Error | null, result?: StreamPostResult) => {
        settled = true;
        signal.removeEventListener('abort', onAbort);
        connection.exchange = null;
        if (error !== null) {
          socket.destroy();
          if (!signal.aborted) Object.assign(error, { answered });
          reject(error);
          return;
        }
        if (reader.keepAlive && reader.done && !socket.destroyed) {
          let list = this.#idle.get(origin);
          if (list === undefined) this.#idle.set(origin, (list = []));
          connection.rest(list);
        } else socket.destroy();
        resolve(result!);
      };
      const reader = new ResponseReader(
        sink,
        () => settle(null, reader.status >= 300 ? { status: reader.status, text: reader.text } : { status: reader.status, complete: true }),
        () => settle(null, { status: reader.status, complete: false }),
      );
      const onAbort = () => settle(signal.reason instanceof Error ? signal.reason : new Error('aborted'));
      if (signal.aborted) return onAbort();
      // Only while this exchange lasts: the connection may serve another one after it.
      sink.flow?.({ pause: () => void (settled || socket.pause()), resume: () => void (settled || socket.resume()) });
      signal.addEventListener('abort', onAbort, { once: true });
      connection.exchange = {
        onBytes(piece) {
          answered = true;
          try {
            reader.push(piece);
          } catch (error) {
            settle(error as Error);
          }
        },
        onEnd(error) {
          if (reader.end()) return; // settled by the reader
          settle(error ?? new StreamPostSocketError('the connection closed', 'UND_ERR_SOCKET'));
        },
      };
      const head = [`POST ${path} HTTP/1.1`, `host: ${host}`, 'content-type: application/json', `content-length: ${Buffer.byteLength(body)}`, ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`)];
      socket.write(`${head.join('\r\n')}\r\n\r\n${body}`);
    });
  }

  /** Closes every idle connection. */
  close(): void {
    for (const list of this.#idle.values()) for (const c of [...list]) c.socket.destroy();
  }
}
