// Relays a residual-stream capture: the engine's bytes go to the client unchanged, once the codec reader
// has seen the whole envelope and it holds every requested layer. The body is kept as the Buffer chunks
// it arrived in (one copy, no string, no parse of the tensor) only until that is decided; vLLM writes
// `activations` last and the envelope's shape after its data, so for vLLM that is the whole body. From a
// plain-HTTP engine the chunks are views of pooled slabs (engine-client/slab-body.ts), given back by
// the route once the client's response has closed (`recycle`), not before.
import { Readable } from 'node:stream';
import { CodecError, CodecScanner, type CodecLocation } from '../codec/index.ts';
import { apiError } from '../errors/index.ts';
import type { EngineResponse } from '../engine-client/index.ts';
import { BodyEnds, type RelayedUsage } from './usage-relay.ts';

export interface CheckedCapture {
  /**
   * The engine's body, byte for byte: the whole of it, in the chunks it arrived in, when it was all
   * held to decide (vLLM's case); else a stream of the chunks held while deciding, then the rest as it arrives.
   */
  body: Buffer[] | Readable;
  /** Content-Length to send, when known (the whole body was held, or the engine announced it). */
  length: number | null;
  codec: CodecLocation;
}

/**
 * Once the envelope is closed, the rest of the body is still held (and the whole sent in one write)
 * while it stays under this size: for vLLM the rest is a few closing bytes. Past it, the rest streams.
 */
const heldRestBytes = 4 * 1024 * 1024;

/**
 * Reads the engine's capture response until its codec envelope is closed, then judges it: fewer layers
 * than `expectedLayers` (or no envelope) is 502 `capture_incomplete`; a body that is not valid JSON up to
 * there, or an envelope whose fields disagree, is 502 `upstream_server_error`. Nothing has been sent to
 * the client when either is thrown. `signal` aborted means the client left: null, nothing to answer.
 *
 * `relayed` is filled in on the way: the engine's usage (from the body's first and last bytes) and
 * whether the engine's body was read to its end, once it has been (for a body sent as a stream, when
 * that stream ends).
 */
export async function checkCapture(upstream: EngineResponse, expectedLayers: number | null, headers: Record<string, string>, signal: AbortSignal, relayed: RelayedUsage): Promise<CheckedCapture | null> {
  const scanner = new CodecScanner();
  const ends = new BodyEnds();
  const held: (Buffer | undefined)[] = [];
  let heldBytes = 0;
  const refuse = (error: Error) => {
    upstream.body.destroy();
    relayed.usage = ends.usage();
    return error;
  };
  // Read in flowing mode: every chunk is taken as the socket delivers it. Pulling one chunk at a time
  // (an async iterator, a pipe through a transform) let the engine's socket stall at every 64 KB chunk
  // and made an 11 MB capture a third slower; the chunks are held here anyway.
  const read = await new Promise<'ended' | 'more' | 'left' | Error>((resolve) => {
    const body = upstream.body;
    let restFrom = -1;
    const finish = (outcome: 'ended' | 'more' | 'left' | Error) => {
      body.off('data', onData);
      body.off('end', onEnd);
      body.off('error', onError);
      signal.removeEventListener('abort', onLeft);
      resolve(outcome);
    };
    const onData = (chunk: Buffer) => {
      held.push(chunk);
      heldBytes += chunk.length;
      ends.add(chunk);
      if (restFrom >= 0) {
        if (heldBytes - restFrom <= heldRestBytes) return;
        body.pause(); // a long rest after the envelope: it streams
        return finish('more');
      }
      try {
        scanner.push(chunk);
      } catch (error) {
        return finish(error as Error);
      }
      if (scanner.codecClosed) restFrom = heldBytes;
    };
    const onEnd = () => {
      try {
        if (!scanner.codecClosed) scanner.end();
        finish('ended');
      } catch (error) {
        finish(error as Error);
      }
    };
    const onError = () => finish(signal.aborted ? 'left' : new Error('the engine connection broke'));
    const onLeft = () => finish('left');
    if (signal.aborted) return resolve('left');
    // The engine call's abort (the client left) destroys the body with an error a tick after the
    // signal fired, when the listeners below may be gone: an 'error' with no listener would throw.
    body.on('error', () => {});
    body.on('data', onData);
    body.once('end', onEnd);
    body.once('error', onError);
    signal.addEventListener('abort', onLeft, { once: true });
  });
  if (read === 'left') {
    upstream.body.destroy();
    relayed.usage = ends.usage();
    return null;
  }
  if (read instanceof CodecError) throw refuse(malformed(read, headers));
  if (read instanceof Error) throw refuse(apiError('upstream_unreachable', 'the model server connection broke while sending the capture', { headers }));
  let codec: CodecLocation | null;
  try {
    codec = scanner.codec();
  } catch (err) {
    if (err instanceof CodecError) throw refuse(malformed(err, headers));
    throw err;
  }
  const layers = codec?.shape[0] ?? 0;
  if (codec === null || (expectedLayers !== null && layers < expectedLayers)) {
    const wanted = expectedLayers === null ? 'the requested' : String(expectedLayers);
    throw refuse(apiError('capture_incomplete', `the activation capture returned ${layers} of ${wanted} requested layers`, { headers }));
  }

  if (read === 'ended') {
    relayed.usage = ends.usage();
    relayed.completed = true;
    return { body: held as Buffer[], length: heldBytes, codec };
  }
  const announced = Number(upstream.headers['content-length'] ?? NaN);
  // Each held chunk is let go once handed on; the rest of the engine's body follows as it arrives,
  // with backpressure.
  let next = 0;
  const source = upstream.body;
  const body = Readable.from(
    (async function* () {
      while (next < held.length) {
        const chunk = held[next]!;
        held[next++] = undefined;
        yield chunk;
      }
      for await (const chunk of source) {
        ends.add(chunk as Buffer);
        yield chunk as Buffer;
      }
      relayed.completed = true;
    })(),
    { objectMode: false, highWaterMark: 256 * 1024 },
  );
  body.once('close', () => {
    relayed.usage = ends.usage();
    source.destroy();
  });
  return { body, length: Number.isSafeInteger(announced) ? announced : null, codec };
}

function malformed(err: CodecError, headers: Record<string, string>) {
  return apiError('upstream_server_error', `the model server's capture response is malformed: ${err.message}`, { fields: { upstream_status: 200 }, headers });
}
