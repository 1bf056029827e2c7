// Compression: with `Accept-Encoding: gzip` every response body is gzipped (level 1: the bodies are
// JSON, highly redundant, and speed matters more than the last percent), whatever its size and route,
// except two that must reach the client as they are: SSE, whose frames must not wait in a compressor,
// and a capture, relayed byte for byte (its base64 tensor hardly compresses, and at hundreds of MB the
// compressor would be the slowest part of the path; gzipped only when full-vocabulary prompt logprobs,
// which the contract compresses, ride with it), as is a harvest shard's download.
import { pipeline, Readable, type Writable } from 'node:stream';
import { createGzip, gzip, gzipSync, type Gzip } from 'node:zlib';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import { drained } from '../backpressure/index.ts';

const level = 1;
/** Bodies up to this size are compressed on the event loop: cheaper than a trip to the thread pool. */
const syncLimitBytes = 64 * 1024;

const leftAsIs = new WeakSet<FastifyReply>();

/** The client accepts gzip: `gzip` (or `*`) listed without `q=0` (RFC 9110, 12.5.3). */
export function acceptsGzip(request: FastifyRequest): boolean {
  const header = request.headers['accept-encoding'];
  if (typeof header !== 'string' || !/gzip|\*/i.test(header)) return false;
  let star: boolean | null = null;
  for (const entry of header.split(',')) {
    const [name, ...params] = entry.split(';');
    const coding = name.trim().toLowerCase();
    if (coding !== 'gzip' && coding !== '*') continue;
    const q = params.map((p) => /^\s*q\s*=\s*([\d.]+)\s*$/i.exec(p)?.[1]).find((v) => v !== undefined);
    const accepted = q === undefined || Number(q) > 0;
    if (coding === 'gzip') return accepted;
    star = accepted;
  }
  return star ?? false;
}

/** This response's body is sent as it is, never compressed (a capture). */
export function sendUncompressed(reply: FastifyReply): void {
  leftAsIs.add(reply);
}

/** A gzip stream for a large body the route feeds itself; the response is marked compressed. */
export function gzipStream(reply: FastifyReply): Gzip {
  reply.header('content-encoding', 'gzip').removeHeader('content-length');
  return createGzip({ level, chunkSize: 128 * 1024 });
}

/** Compresses every body the client accepts gzip for, unless its route compressed it or must not. */
export function installCompression(app: FastifyInstance): void {
  // Callback style, not async: the hook runs on every response, and most need nothing from it.
  app.addHook('onSend', (request, reply, payload, done) => {
    if (payload === null || payload === undefined || leftAsIs.has(reply)) return done(null, payload);
    if (String(reply.getHeader('content-type') ?? '').startsWith('text/event-stream')) return done(null, payload);
    reply.header('vary', 'Accept-Encoding');
    if (!acceptsGzip(request) || reply.hasHeader('content-encoding') || reply.statusCode === 204 || reply.statusCode === 304) return done(null, payload);
    if (typeof payload === 'string' || Buffer.isBuffer(payload)) {
      const bytes = typeof payload === 'string' ? Buffer.from(payload) : payload;
      const compressed = (zipped: Buffer) => {
        reply.header('content-encoding', 'gzip').header('content-length', zipped.length);
        done(null, zipped);
      };
      if (bytes.length <= syncLimitBytes) return compressed(gzipSync(bytes, { level }));
      return void gzip(bytes, { level }, (err, zipped) => (err ? done(err) : compressed(zipped)));
    }
    if (payload instanceof Readable) return done(null, pipeline(payload, gzipStream(reply), () => {}));
    done(null, payload);
  });
}

/**
 * Writes a body into a compressor with backpressure. An explicit loop rather than `pipe`: piping
 * undici's body into zlib ran five times slower here (the parser paused and resumed on every chunk).
 * A body that breaks half-way destroys the compressor, so the client's response ends too.
 */
export async function feed(source: Readable, sink: Writable): Promise<void> {
  try {
    for await (const chunk of source) {
      if (sink.write(chunk)) continue;
      await drained(sink);
      if (sink.destroyed) {
        source.destroy(); // the client left
        return;
      }
    }
    sink.end();
  } catch (err) {
    sink.destroy(err as Error);
  }
}
