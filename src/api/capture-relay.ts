// Relays a residual-stream capture: the engine's bytes go to the client unchanged, once the codec reader
// has seen the whole envelope and it holds every requested layer. The body is kept as the Buffer chunks
// it arrived in (one copy, no string, no parse of the tensor) only until that is decided; vLLM writes
// `activations` last and the envelope's shape after its data, so for vLLM that is the whole body.
import { Readable } from 'node:stream';
import { CodecError, CodecScanner, type CodecLocation } from '../codec/index.ts';
import { apiError } from '../errors/index.ts';
import type { EngineResponse } from '../engine-client/index.ts';

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
 * Reads the engine's capture response until its codec envelope is closed, then judges it: fewer layers
 * than `expectedLayers` (or no envelope) is 502 `capture_incomplete`; a body that is not valid JSON up to
 * there, or an envelope whose fields disagree, is 502 `upstream_server_error`. Nothing has been sent to
 * the client when either is thrown. `signal` aborted means the client left: null, nothing to answer.
 */
export async function checkCapture(upstream: EngineResponse, expectedLayers: number | null, headers: Record<string, string>, signal: AbortSignal): Promise<CheckedCapture | null> {
  const scanner = new CodecScanner();
  const held: (Buffer | undefined)[] = [];
  let heldBytes = 0;
  const source = upstream.body[Symbol.asyncIterator]();
  let ended = false;
  const refuse = (error: Error) => {
    upstream.body.destroy();
    return error;
  };
  try {
    while (!scanner.codecClosed) {
      const next = await source.next();
      if (next.done) {
        ended = true;
        scanner.end();
        break;
      }
      const chunk = next.value as Buffer;
      held.push(chunk);
      heldBytes += chunk.length;
      scanner.push(chunk);
    }
  } catch (err) {
    if (signal.aborted) {
      upstream.body.destroy();
      return null;
    }
    if (err instanceof CodecError) throw refuse(malformed(err, headers));
    throw refuse(apiError('upstream_unreachable', 'the model server connection broke while sending the capture', { headers }));
  }
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

  const announced = Number(upstream.headers['content-length'] ?? NaN);
  const length = ended ? heldBytes : Number.isSafeInteger(announced) ? announced : null;
  if (ended) return { body: held as Buffer[], length, codec };
  // Each held chunk is let go once handed on; the rest of the engine's body follows as it arrives,
  // with backpressure.
  let next = 0;
  const body = Readable.from(
    (async function* () {
      while (next < held.length) {
        const chunk = held[next]!;
        held[next++] = undefined;
        yield chunk;
      }
      for await (const chunk of { [Symbol.asyncIterator]: () => source }) yield chunk as Buffer;
    })(),
    { objectMode: false, highWaterMark: 256 * 1024 },
  );
  body.once('close', () => upstream.body.destroy());
  return { body, length, codec };
}

function malformed(err: CodecError, headers: Record<string, string>) {
  return apiError('upstream_server_error', `the model server's capture response is malformed: ${err.message}`, { fields: { upstream_status: 200 }, headers });
}
