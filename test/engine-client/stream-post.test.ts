import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Buffer } from 'node:buffer';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createNetServer, type AddressInfo, type Socket } from 'node:net';
import { StreamPoster, StreamPostSocketError, type BodySink } from '../../src/engine-client/stream-post.ts';
import { EngineClient } from '../../src/engine-client/index.ts';
import { ApiError } from '../../src/errors/index.ts';

/** A real HTTP server on port 0 answering with `handler`; counts connections. */
async function serve(handler: (req: IncomingMessage, res: ServerResponse, body: string) => void): Promise<{ url: URL; server: Server; connections: () => number; close(): Promise<void> }> {
  let connections = 0;
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (d) => (body += d));
    req.on('end', () => handler(req, res, body));
  });
  server.on('connection', () => connections++);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const url = new URL(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
  return { url, server, connections: () => connections, close: () => new Promise((resolve) => server.close(() => resolve())) };
}

/** A sink that copies what it is given (pieces are valid only during the call). */
function collector(stopAfter = Infinity): BodySink & { bytes(): Buffer; length: number | null | undefined; pieces: number } {
  const parts: Buffer[] = [];
  let seen = 0;
  const sink = {
    length: undefined as number | null | undefined,
    pieces: 0,
    head(length: number | null) {
      sink.length = length;
    },
    chunk(piece: Uint8Array) {
      parts.push(Buffer.from(piece));
      sink.pieces++;
      seen += piece.length;
      return seen < stopAfter;
    },
    bytes: () => Buffer.concat(parts),
  };
  return sink;
}

/** `promise` rejects, with an error `check` accepts (a RegExp: its message). */
async function rejects(promise: Promise<unknown>, check: RegExp | ((e: unknown) => boolean)): Promise<void> {
  try {
    await promise;
  } catch (error) {
    assert.ok(check instanceof RegExp ? check.test((error as Error).message) : check(error), `rejected with ${(error as Error)?.stack ?? error}`);
    return;
  }
  assert.unreachable('it resolved');
}

const payload = Buffer.from(Array.from({ length: 3_000_000 }, (_, i) => (i * 2654435761) >>> 24));

test('a body by Content-Length, written in many pieces, arrives whole; the connection is kept and used again', async () => {
  const { url, connections, close } = await serve((req, res, body) => {
    assert.is(req.method, 'POST');
    assert.is(req.headers['content-type'], 'application/json');
    assert.equal(JSON.parse(body), { n: 1 });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': payload.length });
    for (let at = 0; at < payload.length; at += 100_000) res.write(payload.subarray(at, at + 100_000));
    res.end();
  });
  const poster = new StreamPoster();
  for (let i = 0; i < 3; i++) {
    const sink = collector();
    assert.equal(await poster.post(url, '/v1/completions', {}, '{"n":1}', new AbortController().signal, sink), { status: 200, complete: true });
    assert.is(sink.length, payload.length);
    assert.ok(sink.bytes().equals(payload));
    assert.ok(sink.pieces > 1);
  }
  assert.is(connections(), 1, 'one kept-alive connection for three requests');
  poster.close();
  await close();
});

test('a chunked body, and one without a length read to the connection’s end, arrive whole', async () => {
  const { url, close } = await serve((req, res) => {
    if (req.url === '/chunked') {
      res.writeHead(200, { 'content-type': 'application/json' }); // chunked by node:http
      for (let at = 0; at < payload.length; at += 77_777) res.write(payload.subarray(at, at + 77_777));
      res.end();
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json', connection: 'close' });
    res.socket!.write(''); // head flushed
    res.end(payload);
  });
  const poster = new StreamPoster();
  const chunked = collector();
  assert.equal(await poster.post(url, '/chunked', {}, '{}', new AbortController().signal, chunked), { status: 200, complete: true });
  assert.is(chunked.length, null);
  assert.ok(chunked.bytes().equals(payload));
  const toEnd = collector();
  assert.equal(await poster.post(url, '/close', {}, '{}', new AbortController().signal, toEnd), { status: 200, complete: true });
  assert.ok(toEnd.bytes().equals(payload));
  poster.close();
  await close();
});

test('an error status gives its body as text; a sink that stops ends the exchange and the connection', async () => {
  const { url, connections, close } = await serve((req, res) => {
    if (req.url === '/fail') {
      res.writeHead(503, { 'content-type': 'application/json' });
      res.end('{"error":{"message":"busy","code":"engine_oom"}}');
      return;
    }
    res.writeHead(200, { 'content-length': payload.length });
    res.end(payload);
  });
  const poster = new StreamPoster();
  assert.equal(await poster.post(url, '/fail', {}, '{}', new AbortController().signal, collector()), { status: 503, text: '{"error":{"message":"busy","code":"engine_oom"}}' });
  const stopped = collector(10);
  assert.equal(await poster.post(url, '/ok', {}, '{}', new AbortController().signal, stopped), { status: 200, complete: false });
  const after = collector();
  assert.equal(await poster.post(url, '/ok', {}, '{}', new AbortController().signal, after), { status: 200, complete: true });
  assert.ok(after.bytes().equals(payload));
  assert.is(connections(), 2, 'the stopped exchange’s connection was not used again');
  poster.close();
  await close();
});

test('refused, cut short, stale or aborted: errors, never a partial success', async () => {
  const poster = new StreamPoster();
  // nothing listening
  const probe = createNetServer();
  await new Promise<void>((resolve) => probe.listen(0, '127.0.0.1', resolve));
  const dead = new URL(`http://127.0.0.1:${(probe.address() as AddressInfo).port}`);
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  await rejects(poster.post(dead, '/', {}, '{}', new AbortController().signal, collector()), (e: unknown) => (e as { code?: string }).code === 'ECONNREFUSED');
  // a server that drops the connection half-way through the body
  const sockets: Socket[] = [];
  const raw = createNetServer((socket) => {
    sockets.push(socket);
    socket.once('data', () => {
      socket.write(`HTTP/1.1 200 OK\r\ncontent-length: ${payload.length}\r\n\r\n`);
      socket.end(payload.subarray(0, 1000));
    });
  });
  await new Promise<void>((resolve) => raw.listen(0, '127.0.0.1', resolve));
  const cut = new URL(`http://127.0.0.1:${(raw.address() as AddressInfo).port}`);
  await rejects(poster.post(cut, '/', {}, '{}', new AbortController().signal, collector()), (e: unknown) => e instanceof StreamPostSocketError && (e as { answered?: boolean }).answered === true);
  raw.close();
  // a kept-alive connection the server has since closed: the request goes on a fresh one
  const { url, server, close } = await serve((_req, res) => {
    res.writeHead(200, { 'content-length': 2 });
    res.end('ok');
  });
  assert.equal(await poster.post(url, '/', {}, '{}', new AbortController().signal, collector()), { status: 200, complete: true });
  server.closeIdleConnections();
  await new Promise((resolve) => setTimeout(resolve, 50));
  const again = collector();
  assert.equal(await poster.post(url, '/', {}, '{}', new AbortController().signal, again), { status: 200, complete: true });
  assert.is(again.bytes().toString(), 'ok');
  // a kept-alive connection that fails before answering (the server let it go as the request left): tried again on a fresh one
  let opened = 0;
  const forgetful = createNetServer((socket) => {
    opened++;
    let requests = 0;
    socket.on('data', () => {
      if (++requests === 1) socket.write('HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\none');
      else socket.destroy();
    });
  });
  await new Promise<void>((resolve) => forgetful.listen(0, '127.0.0.1', resolve));
  const stale = new URL(`http://127.0.0.1:${(forgetful.address() as AddressInfo).port}`);
  const first = collector();
  assert.equal(await poster.post(stale, '/', {}, '{}', new AbortController().signal, first), { status: 200, complete: true });
  const second = collector();
  assert.equal(await poster.post(stale, '/', {}, '{}', new AbortController().signal, second), { status: 200, complete: true });
  assert.is(second.bytes().toString(), 'one');
  assert.is(opened, 2, 'the second request went again on a fresh connection');
  forgetful.close();
  // an abort mid-body rejects with the signal's reason
  const slow = await serve((_req, res) => {
    res.writeHead(200, { 'content-length': payload.length });
    res.write(payload.subarray(0, 1000)); // and never the rest
  });
  const abort = new AbortController();
  const pending = poster.post(slow.url, '/', {}, '{}', abort.signal, { head() {}, chunk: () => (abort.abort(new Error('stop here')), true) });
  await rejects(pending, /stop here/);
  slow.server.closeAllConnections();
  poster.close();
  await close();
  await slow.close();
});

test('EngineClient.postStreaming: a 5xx is retried then mapped as post maps it; an unreachable engine is upstream_unreachable', async () => {
  let calls = 0;
  const { url, close } = await serve((_req, res) => {
    calls++;
    if (calls === 1) {
      res.writeHead(500, { 'content-type': 'application/json' });
      res.end('{"error":{"message":"boom","type":"InternalServerError"}}');
      return;
    }
    res.writeHead(200, { 'content-length': payload.length });
    res.end(payload);
  });
  const target = { modelId: 'm', url: url.href.replace(/\/$/, ''), checkpoint: 'c', gpuShape: 'g' };
  const client = new EngineClient([target, { ...target, modelId: 'gone', url: 'http://127.0.0.1:1' }], { retries: 1, retryBaseDelayMs: 1 });
  const sink = collector();
  assert.equal(await client.postStreaming('m', '/v1/completions', '{}', new AbortController().signal, sink), { complete: true });
  assert.is(calls, 2, 'the 500 was tried again');
  assert.ok(sink.bytes().equals(payload));
  await rejects(client.postStreaming('gone', '/v1/completions', '{}', new AbortController().signal, collector()), (e: unknown) => e instanceof ApiError && e.code === 'upstream_unreachable');
  await client.close();
  await close();
});

test.run();
