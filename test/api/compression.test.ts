import { test } from 'uvu';
import * as assert from 'uvu/assert';
import type { FastifyRequest } from 'fastify';
import { acceptsGzip } from '../../src/api/compression.ts';

const accepts = (value: string | undefined) => acceptsGzip({ headers: value === undefined ? {} : { 'accept-encoding': value } } as FastifyRequest);

test('Accept-Encoding: gzip listed, or * with gzip unlisted, and not refused with q=0', () => {
  for (const value of ['gzip', 'GZIP', 'gzip, deflate, br', 'br;q=1.0, gzip;q=0.8, *;q=0.1', 'deflate, *', 'gzip;q=0.001', 'identity, gzip']) {
    assert.ok(accepts(value), value);
  }
  for (const value of [undefined, '', 'identity', 'deflate, br', 'gzip;q=0', 'gzip; q=0.0, deflate', '*;q=0', 'br, *;q=0', 'gzip;q=0, *', 'x-gzip-like']) {
    assert.not.ok(accepts(value), String(value));
  }
});

test.run();
