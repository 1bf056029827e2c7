// Writes a response through 64 KB byte buffers and waits for 'drain', so a huge body (full-vocabulary prompt
// logprobs, gigabytes) never sits in memory whole and makes little garbage: token fragments are pre-encoded
// bytes, numbers are written digit by digit. Rejects once the client has gone.
import type { ServerResponse } from 'node:http';
import { drained } from '../backpressure/index.ts';

const PIECE = 64 * 1024;
const HEADROOM = 16 * 1024;

export class BodyWriter {
  readonly #res: ServerResponse;
  #buf: Buffer = Buffer.allocUnsafe(PIECE);
  #at = 0;
  bytes = 0;
  /** Deferred status line: a body that fits one buffer goes out with a Content-Length, like vLLM's JSON responses. */
  #head: { status: number; headers: Record<string, string> } | null;

  constructor(res: ServerResponse, head?: { status: number; headers: Record<string, string> }) {
    this.#res = res;
    this.#head = head ?? null;
  }

  /**
   * True when the buffer is nearly full: the caller should `await flush()` (backpressure). The unchecked
   * appends (copy, char, int, logprob) rely on this headroom: one vocabulary entry stays far below 16 KB.
   */
  get full(): boolean {
    return this.#at > PIECE - HEADROOM;
  }

  /** Appends text; flushes when the buffer is nearly full (await the promise it then returns). */
  push(s: string): Promise<void> | void {
    const need = Buffer.byteLength(s);
    if (need > PIECE - this.#at) {
      if (this.#at > 0) this.#queue();
      if (need > PIECE) {
        this.#write(Buffer.from(s, 'utf8'));
        return this.#drained();
      }
    }
    this.#at += this.#buf.write(s, this.#at);
    if (this.full) return this.flush();
  }

  /** Appends pre-encoded bytes (each piece well under the headroom). */
  bytesOf(b: Uint8Array): void {
    this.#buf.set(b, this.#at);
    this.#at += b.length;
  }

  /** Appends src[start, end) (small pieces of a pre-encoded blob). */
  copy(src: Uint8Array, start: number, end: number): void {
    const buf = this.#buf;
    let at = this.#at;
    for (let i = start; i < end; i++) buf[at++] = src[i];
    this.#at = at;
  }

  /** Appends a single ASCII character code. */
  char(c: number): void {
    this.#buf[this.#at++] = c;
  }

  /** Appends a non-negative integer. */
  int(n: number): void {
    const buf = this.#buf;
    if (n < 10) {
      buf[this.#at++] = 48 + n;
      return;
    }
    let digits = 1;
    for (let x = n; x >= 10; x = Math.floor(x / 10)) digits++;
    let at = this.#at + digits;
    this.#at = at;
    for (let x = n; at > this.#at - digits; x = Math.floor(x / 10)) buf[--at] = 48 + (x % 10);
  }

  /**
   * Appends a logprob (<= 0) with 9 significant digits: enough to round-trip the float32 it came from. Values
   * at or below -9999 are clamped like vLLM's serializer (JSON has no -Infinity).
   */
  logprob(x: number): void {
    const buf = this.#buf;
    if (!(x > -9999)) {
      this.#at += buf.write('-9999.0', this.#at, 'latin1');
      return;
    }
    const a = -x;
    if (a === 0 || a < 1e-6) {
      this.#at += buf.write(String(x), this.#at, 'latin1');
      return;
    }
    const e = Math.floor(Math.log10(a));
    const decimals = 8 - e; // 9 significant digits; e in [-6, 3] so decimals in [5, 14]
    let m = Math.round(a * POW10[decimals]);
    if (m >= 1e9) m = Math.round(m / 10) * 10; // log10 rounding at a power of ten
    buf[this.#at++] = 45; // '-'
    if (e < 0) {
      buf[this.#at++] = 48;
      buf[this.#at++] = 46;
      for (let z = -1; z > e; z--) buf[this.#at++] = 48;
      this.#digits(m, 9);
    } else {
      const intDigits = e + 1;
      const tmp = this.#at;
      this.#digits(m, 9);
      // shift the fraction one place right to make room for the decimal point
      for (let i = tmp + 9; i > tmp + intDigits; i--) buf[i] = buf[i - 1];
      buf[tmp + intDigits] = 46;
      this.#at++;
    }
  }

  #digits(m: number, count: number): void {
    const buf = this.#buf;
    let at = this.#at + count;
    this.#at = at;
    for (let i = 0; i < count; i++, m = Math.floor(m / 10)) buf[--at] = 48 + (m % 10);
  }

  async flush(): Promise<void> {
    if (this.#at === 0) return;
    this.#queue();
    await this.#drained();
  }

  #queue(): void {
    const chunk = this.#buf.subarray(0, this.#at);
    this.#buf = Buffer.allocUnsafe(PIECE);
    this.#at = 0;
    this.#write(chunk);
  }

  #ok = true;

  #write(chunk: Buffer): void {
    const res = this.#res;
    if (res.destroyed || res.writableEnded) throw new Error('client went away');
    if (this.#head) {
      res.writeHead(this.#head.status, this.#head.headers);
      this.#head = null;
    }
    this.bytes += chunk.length;
    if (!res.write(chunk)) this.#ok = false;
  }

  async #drained(): Promise<void> {
    if (this.#ok) return;
    if (!(await drained(this.#res))) throw new Error('client went away');
    this.#ok = true;
  }

  async end(): Promise<void> {
    if (this.#head) {
      const body = this.#buf.subarray(0, this.#at);
      this.#res.writeHead(this.#head.status, { ...this.#head.headers, 'content-length': String(body.length) });
      this.#head = null;
      this.bytes += body.length;
      this.#res.end(body);
      return;
    }
    await this.flush();
    this.#res.end();
  }
}

const POW10 = Float64Array.from({ length: 16 }, (_, i) => 10 ** i);
