/**
 * Relays that learn a response's usage on the way through, without parsing its body: streams are
 * always billed, and a completion body's `usage` object is read from its last bytes.
 */
import { Transform, type TransformCallback, type Writable } from 'node:stream';

export interface EngineUsage {
  prompt_tokens: number;
  completion_tokens: number;
}

export interface RelayedUsage {
  /** The engine's usage, when its body (or usage frame) came through whole. */
  usage: EngineUsage | null;
  /** Content frames received from the engine and passed on (one per generated token per choice): what was generated when the stream broke off. */
  contentFrames: number;
  /**
   * Content frames the client's socket took: those of the chunks written to the response whose write
   * callback came back without an error (the bytes were handed to the kernel before the socket closed).
   * At most `contentFrames`; 0 for a body that is not a stream.
   */
  relayedFrames: number;
  /** The body ended normally. */
  completed: boolean;
}

const frameEnd = Buffer.from('\n\n');
const emptyChoices = Buffer.from('"choices":[]');
const done = Buffer.from('data: [DONE]');
const errorKey = Buffer.from('"error"');

/**
 * Passes SSE frames through whole. Counts content frames, reads the engine's usage frame (the gateway
 * asks for it on every stream) and drops it when the client did not ask for it. A partial frame is
 * held back until its end arrives, so if the engine's connection breaks mid-frame the client never
 * sees torn bytes: `fail` then ends the stream with the error frame and `[DONE]`.
 */
export class SseUsageRelay extends Transform {
  readonly result: RelayedUsage = { usage: null, contentFrames: 0, relayedFrames: 0, completed: false };
  #partial: Buffer | null = null;
  readonly #forwardUsage: boolean;
  /** Content frames counted up to the end of each chunk pushed and not yet written, oldest first. */
  readonly #pushed: number[] = [];
  /** The same for each chunk written to the response whose write callback has not come back. */
  readonly #unacknowledged: number[] = [];

  constructor(forwardUsage: boolean) {
    super();
    this.#forwardUsage = forwardUsage;
  }

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    const data = this.#partial ? Buffer.concat([this.#partial, chunk]) : chunk;
    this.#partial = null;
    let start = 0;
    let sendFrom = 0;
    for (;;) {
      const end = data.indexOf(frameEnd, start);
      if (end < 0) break;
      const next = end + 2;
      if (this.#inspect(data, start, end)) {
        // The usage frame the client did not ask for: send what came before it, skip it.
        if (start > sendFrom) this.#send(data.subarray(sendFrom, start));
        sendFrom = next;
      }
      start = next;
    }
    if (start > sendFrom) this.#send(data.subarray(sendFrom, start));
    if (start < data.length) this.#partial = data.subarray(start);
    callback();
  }

  override _flush(callback: TransformCallback): void {
    // An unterminated last frame is not a frame: drop it rather than hand the client torn bytes.
    this.#partial = null;
    this.result.completed = true;
    callback();
  }

  /** Ends the client's stream with a mid-stream error frame after the last whole frame. */
  fail(errorFrame: string): void {
    if (this.destroyed || this.readableEnded) return;
    this.#partial = null;
    this.#send(Buffer.from(errorFrame));
    this.push(null);
  }

  /**
   * Writes the frames to the client's response with backpressure (instead of a pipe, whose writes
   * carry no callback), ends it after the last one, and counts `relayedFrames` as the writes come back.
   * A response that closes first destroys the relay (which cancels the engine's body).
   */
  writeTo(res: Writable): void {
    // Write callbacks come back in write order (one per write; after the socket died they fail or never come).
    const acknowledged = (err?: Error | null) => {
      const upTo = this.#unacknowledged.shift();
      if (!err && upTo !== undefined) this.result.relayedFrames = upTo;
    };
    this.on('data', (chunk: Buffer) => {
      this.#unacknowledged.push(this.#pushed.shift() ?? this.result.contentFrames);
      if (!res.write(chunk, acknowledged)) this.pause();
    });
    res.on('drain', () => this.resume());
    this.once('end', () => res.end());
    this.once('error', () => res.destroy());
    // A write to a socket that died fails its callback and may emit an error too: the client left, nothing to throw.
    res.on('error', () => this.destroy());
    res.once('close', () => this.destroy());
  }

  /** Pushes whole frames on, noting how many content frames have been counted up to their end. */
  #send(frames: Buffer): void {
    this.#pushed.push(this.result.contentFrames);
    this.push(frames);
  }

  /** Reads one frame; true when it is the usage frame and must not be forwarded. */
  #inspect(data: Buffer, start: number, end: number): boolean {
    const frame = data.subarray(start, end);
    if (frame.indexOf(done) === 0) return false;
    if (frame.indexOf(emptyChoices) >= 0) {
      const usage = usageFrom(frame);
      if (usage) {
        this.result.usage = usage;
        return !this.#forwardUsage;
      }
      return false;
    }
    if (frame.indexOf(errorKey) < 0) this.result.contentFrames++;
    return false;
  }
}

/**
 * Keeps the first and last bytes of a body that flows through, to read its `usage` at the end: vLLM
 * writes it after the choices, which is the end of a completion but comes before a capture's
 * `activations`.
 */
export class UsageTail extends Transform {
  readonly result: RelayedUsage = { usage: null, contentFrames: 0, relayedFrames: 0, completed: false };
  readonly #ends = new BodyEnds();

  override _transform(chunk: Buffer, _encoding: BufferEncoding, callback: TransformCallback): void {
    this.#ends.add(chunk);
    callback(null, chunk);
  }

  override _flush(callback: TransformCallback): void {
    this.result.usage = this.#ends.usage();
    this.result.completed = true;
    callback();
  }
}

const headBytes = 64 * 1024;

const tailBytes = 4096;

/**
 * The first and last bytes of a body, kept chunk by chunk: a completion's `usage` object is in its
 * last bytes (vLLM writes it after the choices), or near its start when a large part follows it (a
 * capture's `activations`, written last).
 */
export class BodyEnds {
  readonly #head: Buffer[] = [];
  #headBytes = 0;
  #tail: Buffer = Buffer.alloc(0);

  add(chunk: Buffer): void {
    if (this.#headBytes < headBytes) {
      this.#head.push(chunk.subarray(0, headBytes - this.#headBytes));
      this.#headBytes += Math.min(chunk.length, headBytes - this.#headBytes);
    }
    this.#tail = keepTail(this.#tail, chunk);
  }

  usage(): EngineUsage | null {
    return usageFrom(this.#tail.subarray(Math.max(0, this.#tail.length - tailBytes))) ?? usageFrom(Buffer.concat(this.#head));
  }
}

/**
 * The body's last bytes once `chunk` is added: at least `tailBytes` of them (or the whole body so far). A chunk
 * that long is the tail, by reference (it is held or relayed anyway; copying its end was an allocation per
 * chunk, 173 per 11 MB capture); a shorter one is joined to the previous tail's end, a copy of at most `tailBytes`.
 */
function keepTail(tail: Buffer, chunk: Buffer): Buffer {
  if (chunk.length >= tailBytes) return chunk;
  return Buffer.concat([tail.subarray(Math.max(0, tail.length - (tailBytes - chunk.length))), chunk]);
}

const usageKey = Buffer.from('"usage"');

/** The last `"usage": {...}` object in `bytes` (vLLM writes it after the choices), or null. */
export function usageFrom(bytes: Buffer): EngineUsage | null {
  let at = bytes.lastIndexOf(usageKey);
  // Inside a JSON string the quotes would be escaped: such an occurrence is text, not the key.
  while (at > 0 && bytes[at - 1] === 0x5c /* \\ */) at = bytes.lastIndexOf(usageKey, at - 1);
  if (at < 0) return null;
  const open = bytes.indexOf(0x7b /* { */, at);
  if (open < 0) return null;
  let depth = 0;
  for (let i = open; i < bytes.length; i++) {
    if (bytes[i] === 0x7b) depth++;
    else if (bytes[i] === 0x7d && --depth === 0) {
      try {
        const parsed = JSON.parse(bytes.toString('utf8', open, i + 1)) as Partial<EngineUsage>;
        if (Number.isInteger(parsed.prompt_tokens) && Number.isInteger(parsed.completion_tokens)) {
          return { prompt_tokens: parsed.prompt_tokens!, completion_tokens: parsed.completion_tokens! };
        }
      } catch {
        /* not a usage object after all */
      }
      return null;
    }
  }
  return null;
}
