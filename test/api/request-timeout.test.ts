/**
 * Receiving a request is bounded (SVC_HTTP_HEADERS_TIMEOUT_MS, SVC_HTTP_REQUEST_TIMEOUT_MS, set short
 * here): an authenticated request that announces 8 MB and sends one byte, or headers that never end,
 * are answered 408 `invalid_request` in the envelope and their connection is closed; a response that
 * takes longer than the bounds is not cut.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { connect, type Socket } from 'node:net';
import { loadSettings } from '../../src/config/index.ts';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';
import { startFailingEngine, staticModel, type FailingEngine } from '../support/failing-engine.ts';

const it = suite('bounds on receiving a request');
let gw: TestGateway;
let engine: FailingEngine;

it.before(async () => {
  // Through the environment variables, as an operator sets them (startTestGateway reads process.env).
  process.env.SVC_HTTP_HEADERS_TIMEOUT_MS = '1000';
  process.env.SVC_HTTP_REQUEST_TIMEOUT_MS = '1500';
  engine = await startFailingEngine('ok');
  gw = await startTestGateway({ models: [staticModel(engine.url)] });
});
it.after(async () => {
  delete process.env.SVC_HTTP_HEADERS_TIMEOUT_MS;
  delete process.env.SVC_HTTP_REQUEST_TIMEOUT_MS;
  await gw?.stop();
  await engine?.close();
});

/** Writes `head` (and `body`) on a raw connection, then waits (at most 30 s) for the server to close it. */
async function sendAndWaitForClose(head: string, body = ''): Promise<{ closed: boolean; response: string }> {
  const { port } = new URL(gw.url);
  const socket: Socket = connect(Number(port), '127.0.0.1');
  let response = '';
  socket.on('data', (d) => (response += d));
  socket.on('error', () => {});
  await new Promise<void>((resolve) => socket.once('connect', () => resolve()));
  socket.write(head + body);
  const closed = await new Promise<boolean>((resolve) => {
    const timer = setTimeout(() => resolve(false), 30_000);
    socket.once('close', () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
  socket.destroy();
  return { closed, response };
}

function assert408(response: string) {
  assert.match(response, /^HTTP\/1\.1 408 /);
  const body = JSON.parse(response.slice(response.indexOf('\r\n\r\n') + 4));
  assert.is(body.error.code, 'invalid_request');
  assert.is(body.error.message, 'the request was not received in time');
  assert.match(response, /\r\nx-request-id: /i);
}

it('the settings come from the environment, and the headers may not outlast the request', () => {
  assert.equal(loadSettings({ SVC_HTTP_HEADERS_TIMEOUT_MS: '1000', SVC_HTTP_REQUEST_TIMEOUT_MS: '1500' }, { models: [] }).http, { headersTimeoutMs: 1000, requestTimeoutMs: 1500 });
  assert.equal(loadSettings({}, { models: [] }).http, { headersTimeoutMs: 30_000, requestTimeoutMs: 300_000 });
  assert.throws(() => loadSettings({ SVC_HTTP_HEADERS_TIMEOUT_MS: '2000', SVC_HTTP_REQUEST_TIMEOUT_MS: '1500' }, { models: [] }), /must not exceed SVC_HTTP_REQUEST_TIMEOUT_MS/);
});

it('Content-Length 8,000,000 and one byte, authenticated: 408 in the envelope, connection closed', async () => {
  const head =
    `POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${gw.apiKey}\r\n` +
    'Content-Type: application/json\r\nContent-Length: 8000000\r\n\r\n';
  const { closed, response } = await sendAndWaitForClose(head, '{');
  assert.ok(closed, 'the server closed the connection');
  assert408(response);
  assert.is(engine.received, 0);
});

it('headers that never end: 408, connection closed', async () => {
  const { closed, response } = await sendAndWaitForClose(`GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: a`);
  assert.ok(closed, 'the server closed the connection');
  assert408(response);
});

it('a response that takes longer than the bounds is not cut', async () => {
  engine.delayMs = 2_500;
  try {
    const res = await fetch(`${gw.url}/v1/completions`, {
      method: 'POST',
      headers: { ...gw.authHeaders(), 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'slow', max_tokens: 1 }),
    });
    assert.is(res.status, 200);
    assert.is((await json(res)).object, 'text_completion');
  } finally {
    engine.delayMs = 0;
  }
});

it.run();
