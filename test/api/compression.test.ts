import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { FastifyRequest } from 'fastify';
import { Readable } from 'node:stream';
import { createGunzip, createGzip } from 'node:zlib';
import { acceptsGzip, feed } from '../../src/api/compression.ts';

const accepts = (value: string | undefined) => acceptsGzip({ headers: value === undefined ? {} : { 'accept-encoding': value } } as FastifyRequest);

test('Accept-Encoding: gzip listed, or * with gzip unlisted, and not refused with q=0', () => {
  for (const value of ['gzip', 'GZIP', 'gzip, deflate, br', 'br;q=1.0, gzip;q=0.8, *;q=0.1', 'deflate, *', 'gzip;q=0.001', 'identity, gzip']) {
    assert.ok(accepts(value), value);
  }
  for (const value of [undefined, '', 'identity', 'deflate, br', 'gzip;q=0', 'gzip; q=0.0, deflate', '*;q=0', 'br, *;q=0', 'gzip;q=0, *', 'x-gzip-like']) {
    assert.not.ok(accepts(value), String(value));
  }
});

test('a large body fed into the compressor arrives whole, and leaves no listener behind per refused write', async () => {
  const chunk = Buffer.alloc(64 * 1024, 'a');
  const chunks = 512; // 32 MiB: the compressor's 16 KiB buffer refuses every chunk
  const gzip = createGzip({ level: 1 });
  let inflated = 0;
  const unzipped = gzip.pipe(createGunzip()).on('data', (d: Buffer) => (inflated += d.length));
  const ended = new Promise((resolve) => unzipped.once('end', resolve));
  const most = { close: 0, drain: 0, error: 0 };
  const source = Readable.from(
    (function* () {
      for (let i = 0; i < chunks; i++) {
        for (const event of ['close', 'drain', 'error'] as const) most[event] = Math.max(most[event], gzip.listenerCount(event));
        yield chunk;
      }
    })(),
  );
  await feed(source, gzip);
  await ended;
  assert.is(inflated, chunks * chunk.length);
  // The stream's own (pipe, gunzip) listeners only: a leak left one more close and error listener per chunk.
  assert.ok(most.close <= 3 && most.error <= 3 && most.drain <= 3, JSON.stringify(most));
});

test.run();
