import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { request as httpRequest } from 'node:http';
import { connect } from 'node:net';
import { loadSettings } from '../../src/config/index.ts';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';
import { assertDocumented } from '../support/openapi.ts';

const http = suite<{ gw: TestGateway }>('http skeleton');
let gw: TestGateway;

http.before(async () => {
  gw = await startTestGateway();
});
http.after(async () => {
  await gw?.stop();
});

function assertEnvelope(body: any, res: Response, code: string) {
  assert.type(body.error, 'object');
  assert.is(body.error.code, code);
  assert.type(body.error.message, 'string');
  assert.type(body.error.type, 'string');
  assert.is(body.request_id, res.headers.get('x-request-id'));
  assert.not.ok('detail' in body);
}

http('GET /health is 200 with the documented shape and a request id', async () => {
  const res = await fetch(`${gw.url}/health`);
  assert.is(res.status, 200);
  assert.match(res.headers.get('x-request-id') ?? '', /^[A-Za-z0-9_-]{1,64}$/);
  const body = await json(res);
  assert.is(body.status, 'ok');
  assert.type(body.wrapper.uptime_seconds, 'number');
  assert.ok(Number.isInteger(body.wrapper.uptime_seconds));
  assert.is(body.wrapper.database.ok, true);
  assert.ok(Number.isInteger(body.wrapper.database.latency_ms));
  assert.ok(Array.isArray(body.backends));
  assert.equal(body.degraded_backends, []);
  const byte = body.backends.find((b: any) => b.model_id === 'ref-byte');
  assert.ok(byte, 'the default model is a backend');
  for (const key of ['status', 'gpu_shape', 'breaker_state', 'breaker_consecutive_failures', 'breaker_last_failure_kind', 'last_completion_at', 'last_completion_seconds_ago', 'warm_estimate']) {
    assert.ok(key in byte, `backends[].${key}`);
  }
});

http('a well-formed client X-Request-Id is echoed; a malformed one is replaced', async () => {
  const ok = await fetch(`${gw.url}/health`, { headers: { 'x-request-id': 'client_id-123' } });
  assert.is(ok.headers.get('x-request-id'), 'client_id-123');
  await ok.arrayBuffer();
  const bad = await fetch(`${gw.url}/health`, { headers: { 'x-request-id': 'has spaces and $' } });
  const minted = bad.headers.get('x-request-id') ?? '';
  assert.is.not(minted, 'has spaces and $');
  assert.match(minted, /^[A-Za-z0-9_-]{1,64}$/);
  await bad.arrayBuffer();
  const long = await fetch(`${gw.url}/health`, { headers: { 'x-request-id': 'a'.repeat(65) } });
  assert.is.not(long.headers.get('x-request-id'), 'a'.repeat(65));
  await long.arrayBuffer();
});

http('minted request ids are unique', async () => {
  const ids = new Set<string>();
  for (let i = 0; i < 50; i++) {
    const res = await fetch(`${gw.url}/health`);
    ids.add(res.headers.get('x-request-id')!);
    await res.arrayBuffer();
  }
  assert.is(ids.size, 50);
});

http('unknown route: 404 in the envelope', async () => {
  const res = await fetch(`${gw.url}/v1/nope?x=1`);
  assert.is(res.status, 404);
  assertEnvelope(await json(res), res, 'not_found');
});

http('wrong method on a known route: 405 with Allow, in the envelope', async () => {
  const res = await fetch(`${gw.url}/v1/completions`);
  assert.is(res.status, 405);
  assert.match(res.headers.get('allow') ?? '', /POST/);
  assertEnvelope(await json(res), res, 'method_not_allowed');
});

http('the route is judged before the body: unknown route with bad JSON is 404, wrong method with a body is 405', async () => {
  const unknown = await fetch(`${gw.url}/v1/unknown`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{bad' });
  assert.is(unknown.status, 404);
  assertEnvelope(await json(unknown), unknown, 'not_found');
  const wrong = await fetch(`${gw.url}/health`, { method: 'POST', headers: { 'content-type': 'text/plain' }, body: 'x' });
  assert.is(wrong.status, 405);
  assertEnvelope(await json(wrong), wrong, 'method_not_allowed');
});

http('a path parameter over 2,048 characters: 400 invalid_request on every route that has one', async () => {
  const docs = [await json(await fetch(`${gw.url}/openapi.json`)), await json(await fetch(`${gw.url}/admin/openapi.json`, { headers: gw.adminHeaders() }))];
  let routes = 0;
  for (const doc of docs) {
    for (const [path, operations] of Object.entries<any>(doc.paths)) {
      if (!path.includes('{')) continue;
      for (const method of Object.keys(operations)) {
        if (!['get', 'post', 'put', 'patch', 'delete'].includes(method)) continue;
        for (const length of [2049, 5000]) {
          const url = path.replace(/\{[^}]+\}/g, 'a'.repeat(length));
          const headers = path.startsWith('/admin') ? gw.adminHeaders() : gw.authHeaders();
          const res = await fetch(`${gw.url}${url}`, { method: method.toUpperCase(), headers: { ...headers, 'content-type': 'application/json' }, body: method === 'get' || method === 'delete' ? undefined : '{}' });
          const body = await json(res);
          assert.is(res.status, 400, `${method.toUpperCase()} ${path} with ${length} characters: ${JSON.stringify(body)}`);
          assertEnvelope(body, res, 'invalid_request');
          assert.is(body.error.message, 'a path parameter is longer than 2048 characters');
          assertDocumented(doc, method.toUpperCase(), path, res);
        }
        routes++;
      }
    }
  }
  assert.ok(routes >= 8, `${routes} routes with a path parameter`);
});

http('malformed JSON: 400 bad_json', async () => {
  const res = await fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json' }, body: '{"prompt": "x",' });
  assert.is(res.status, 400);
  assertEnvelope(await json(res), res, 'bad_json');
});

http('empty JSON body: 400 bad_json', async () => {
  const res = await fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json' }, body: '' });
  assert.is(res.status, 400);
  assertEnvelope(await json(res), res, 'bad_json');
});

http('application/json with a charset parameter is JSON', async () => {
  const res = await fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json; charset=utf-8' }, body: '{"prompt": "a", "max_tokens": 1}' });
  assert.is(res.status, 200);
  await res.arrayBuffer();
});

http('a bare OPTIONS request is answered, not refused in plain text', async () => {
  const res = await fetch(`${gw.url}/v1/completions`, { method: 'OPTIONS' });
  assert.ok(res.status < 400, `status ${res.status}`);
  assert.ok(res.headers.get('x-request-id'));
  await res.arrayBuffer();
});

http('non-JSON content type: 400 invalid_request naming Content-Type', async () => {
  const res = await fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'text/plain' }, body: 'hello' });
  assert.is(res.status, 400);
  const body = await json(res);
  assertEnvelope(body, res, 'invalid_request');
  assert.match(body.error.message, /Content-Type/);
});

http('body over 8 MB: 413 request_too_large with X-Should-Retry: false', async () => {
  const big = JSON.stringify({ prompt: 'x'.repeat(8 * 1024 * 1024 + 10) });
  const res = await fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json' }, body: big });
  assert.is(res.status, 413);
  assert.is(res.headers.get('x-should-retry'), 'false');
  assertEnvelope(await json(res), res, 'request_too_large');
  assertDocumented(await json(await fetch(`${gw.url}/openapi.json`)), 'POST', '/v1/completions', res);
});

http('body over 8 MB without Content-Length (chunked): still 413', async () => {
  const url = new URL(`${gw.url}/v1/completions`);
  const result = await new Promise<{ status: number; headers: Record<string, any>; body: string }>((resolve, reject) => {
    const req = httpRequest({ host: url.hostname, port: url.port, path: url.pathname, method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json', 'transfer-encoding': 'chunked' } }, (res) => {
      let body = '';
      res.on('data', (d) => (body += d));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body }));
    });
    req.on('error', reject);
    const chunk = 'x'.repeat(1024 * 1024);
    req.write('{"prompt": "');
    let i = 0;
    const pump = () => {
      while (i < 9) {
        i++;
        if (!req.write(chunk)) return req.once('drain', pump);
      }
      req.end('"}');
    };
    pump();
  });
  assert.is(result.status, 413);
  const body = JSON.parse(result.body);
  assert.is(body.error.code, 'request_too_large');
  assert.is(body.request_id, result.headers['x-request-id']);
});

http('chat completions: always 400 chat_completions_unsupported, whatever the body', async () => {
  for (const body of ['{"messages": []}', 'not json at all', '']) {
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    assert.is(res.status, 400);
    const parsed = await json(res);
    assertEnvelope(parsed, res, 'chat_completions_unsupported');
    assert.match(parsed.error.message, /\/v1\/completions/);
  }
  // Any call: every method, not 405.
  for (const method of ['GET', 'PUT', 'PATCH', 'DELETE']) {
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method });
    assert.is(res.status, 400, method);
    assertEnvelope(await json(res), res, 'chat_completions_unsupported');
  }
  const head = await fetch(`${gw.url}/v1/chat/completions`, { method: 'HEAD' });
  assert.is(head.status, 400);
});

http('CORS: preflight allows any origin and exposes our headers', async () => {
  const pre = await fetch(`${gw.url}/v1/completions`, {
    method: 'OPTIONS',
    headers: { origin: 'https://notebook.example', 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization,content-type' },
  });
  assert.ok(pre.status === 204 || pre.status === 200);
  assert.is(pre.headers.get('access-control-allow-origin'), '*');
  assert.ok(pre.headers.get('x-request-id'));
  await pre.arrayBuffer();
  const res = await fetch(`${gw.url}/health`, { headers: { origin: 'https://notebook.example' } });
  assert.is(res.headers.get('access-control-allow-origin'), '*');
  assert.not.ok(res.headers.get('access-control-allow-credentials'));
  const exposed = (res.headers.get('access-control-expose-headers') ?? '').toLowerCase();
  for (const h of ['x-request-id', 'retry-after', 'x-svc-upstream-model', 'x-svc-max-tokens-clamped']) assert.ok(exposed.includes(h), h);
  await res.arrayBuffer();
});

http('GET /health is 503 with status down when the store is unreachable', async () => {
  // No engine: only its store matters here.
  const other = await startTestGateway({ engines: { ...loadSettings({}, { models: [] }).engines, warmAtStart: false } });
  try {
    await other.store.close();
    const res = await fetch(`${other.url}/health`);
    assert.is(res.status, 503);
    assert.ok(res.headers.get('x-request-id'));
    const body = await json(res);
    assert.is(body.status, 'down');
    assert.is(body.wrapper.database.ok, false);
  } finally {
    await other.stop().catch(() => undefined);
  }
});

/** Sends raw bytes on a fresh connection and returns everything the server wrote before closing it. */
function rawExchange(url: string, bytes: string): Promise<string> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => socket.write(bytes));
    const chunks: Buffer[] = [];
    socket.on('data', (c) => chunks.push(c));
    socket.on('error', reject);
    socket.on('close', () => resolve(Buffer.concat(chunks).toString('latin1')));
  });
}

http('requests Node refuses before routing (headers over 16 KB, a malformed request): the envelope and a request id', async () => {
  const doc = await json(await fetch(`${gw.url}/openapi.json`));
  const cases = [
    { bytes: `GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${'a'.repeat(17_000)}\r\n\r\n`, status: 431 },
    { bytes: 'GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n', status: 400 },
    { bytes: 'NOT A REQUEST\r\n\r\n', status: 400 },
  ];
  for (const { bytes, status } of cases) {
    const answer = await rawExchange(gw.url, bytes);
    const [head, body] = answer.split('\r\n\r\n');
    assert.match(head, new RegExp(`^HTTP/1.1 ${status} `), head);
    const requestId = /\r\nx-request-id: (\S+)/i.exec(head)?.[1];
    assert.match(requestId ?? '', /^req_/);
    const parsed = JSON.parse(body);
    assert.is(parsed.error.code, 'invalid_request');
    assert.type(parsed.error.message, 'string');
    assert.is(parsed.request_id, requestId);
    assert.ok(doc.paths['/v1/models'].get.responses[String(status)], `${status} is documented`);
  }
  // A path the static files of /swagger refuse (outside their folder) is not there: 404, not a 500.
  const outside = await rawExchange(gw.url, 'GET /swagger/static/../package.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n');
  assert.match(outside, /^HTTP\/1.1 404 /);
  assert.match(outside, /"code":"not_found"/);
});

http.run();
