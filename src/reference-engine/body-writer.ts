// Writes a response in ~64 KB pieces and waits for 'drain', so a huge body (full-vocabulary prompt logprobs)
// never sits in memory whole. Rejects once the client has gone.
import type { ServerResponse } from 'node:http';

const PIECE = 64 * 1024;

export class BodyWriter {
  readonly #res: ServerResponse;
  #buf = '';
  bytes = 0;

  constructor(res: ServerResponse) {
    this.#res = res;
  }

  /** Buffers `s`; returns a promise only when the buffer was flushed (await it to honour backpressure). */
  push(s: string): Promise<void> | void {
    this.#buf += s;
    if (this.#buf.length >= PIECE) return this.flush();
  }

  async flush(): Promise<void> {
    if (this.#buf.length === 0) return;
    const res = this.#res;
    if (res.destroyed || res.writableEnded) throw new Error('client went away');
    const chunk = Buffer.from(this.#buf, 'utf8');
    this.#buf = '';
    this.bytes += chunk.length;
    if (res.write(chunk)) return;
    await new Promise<void>((resolve, reject) => {
      const done = () => {
        res.off('drain', done);
        res.off('close', gone);
        resolve();
      };
      const gone = () => {
        res.off('drain', done);
        res.off('close', gone);
        reject(new Error('client went away'));
      };
      res.on('drain', done);
      res.on('close', gone);
    });
  }

  async end(): Promise<void> {
    await this.flush();
    this.#res.end();
  }
}
