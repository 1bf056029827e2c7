/**
 * Failed authentications per client address (SVC_AUTH_FAILURE_LIMIT, set to 5 here): wrong API keys
 * and wrong admin tokens from one address count together; past the limit that address is refused 429
 * `rate_limited` in the envelope with Retry-After, before its credentials are looked at, on every
 * authenticated route; clients at other addresses, and a client that authenticates correctly however
 * often, are never refused. Clients are told apart by their source address (127.0.0.x on loopback).
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { Agent, fetch as undiciFetch } from 'undici';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';
import { assertDocumented } from '../support/openapi.ts';
import { staticModel } from '../support/failing-engine.ts';

const it = suite('failed authentications per client address');
let gw: TestGateway;
let doc: any;
let adminDoc: any;
const agents: Agent[] = [];

it.before(async () => {
  process.env.SVC_AUTH_FAILURE_LIMIT = '5';
  gw = await startTestGateway({ models: [staticModel('http://127.0.0.1:9')] }); // no engine is called
  doc = await json(await fetch(`${gw.url}/openapi.json`));
  adminDoc = await json(await fetch(`${gw.url}/admin/openapi.json`));
});
it.after(async () => {
  delete process.env.SVC_AUTH_FAILURE_LIMIT;
  await Promise.all(agents.map((a) => a.close()));
  await gw?.stop();
});

/** A client at source address `address`. */
function client(address: string) {
  const agent = new Agent({ localAddress: address });
  agents.push(agent);
  return async (method: string, path: string, authorization?: string) => {
    const res = await undiciFetch(`${gw.url}${path}`, { method, dispatcher: agent, headers: authorization ? { authorization } : {} });
    const text = await res.text();
    return { res: res as unknown as Response, status: res.status, body: text.startsWith('{') ? JSON.parse(text) : text };
  };
}

const wrongKey = 'Bearer svc_aaaaaaaaaaaa_' + 'x'.repeat(43);

it('past 5 failures an address is refused 429 before its credentials are looked at; others are not', async () => {
  const guesser = client('127.0.0.2');
  // Wrong keys and wrong admin tokens count together.
  for (let i = 0; i < 3; i++) assert.is((await guesser('GET', '/v1/models', wrongKey)).status, 401);
  assert.is((await guesser('GET', '/admin/keys', 'Bearer not-the-token')).status, 401);
  assert.is((await guesser('GET', '/admin/keys')).status, 401, 'a missing token is a failure too');
  for (const [method, path, authorization] of [
    ['GET', '/v1/models', wrongKey],
    ['GET', '/admin/keys', 'Bearer not-the-token'],
    ['GET', '/admin/keys', `Bearer ${gw.adminToken}`],
    ['GET', '/v1/models', `Bearer ${gw.apiKey}`],
  ] as const) {
    const refused = await guesser(method, path, authorization);
    assert.is(refused.status, 429, `${method} ${path}`);
    assert.is(refused.body.error.code, 'rate_limited');
    assert.is(refused.body.error.type, 'rate_limit_error');
    assert.match(refused.body.error.message, /^too many failed authentications from this address \(5 within 60 s\); try again in \d+ s$/);
    const retryAfter = Number(refused.res.headers.get('retry-after'));
    assert.ok(retryAfter >= 1 && retryAfter <= 60, `Retry-After ${retryAfter}`);
    assert.is(refused.body.request_id, refused.res.headers.get('x-request-id'));
    assertDocumented(path.startsWith('/admin') ? adminDoc : doc, method, path, refused.res);
  }
  // The public routes need no authentication and are not refused.
  assert.is((await guesser('GET', '/health')).status, 200);

  // Another address is untouched: its own failures are its own.
  const other = client('127.0.0.3');
  assert.is((await other('GET', '/v1/models', `Bearer ${gw.apiKey}`)).status, 200);
  assert.is((await other('GET', '/admin/keys', `Bearer ${gw.adminToken}`)).status, 200);
  assert.is((await other('GET', '/v1/models', wrongKey)).status, 401);
});

it('a client that authenticates correctly is never refused, however many requests it sends', async () => {
  const good = client('127.0.0.4');
  for (let i = 0; i < 50; i++) {
    assert.is((await good('GET', '/v1/models', `Bearer ${gw.apiKey}`)).status, 200);
    assert.is((await good('GET', '/admin/keys', `Bearer ${gw.adminToken}`)).status, 200);
  }
  // Four mistakes among them stay under the limit.
  for (let i = 0; i < 4; i++) assert.is((await good('GET', '/v1/models', wrongKey)).status, 401);
  assert.is((await good('GET', '/v1/models', `Bearer ${gw.apiKey}`)).status, 200);
});

it('behind a trusted proxy (SVC_TRUSTED_PROXIES) the client is the one X-Forwarded-For names', async () => {
  process.env.SVC_TRUSTED_PROXIES = '127.0.0.1';
  const proxied = await startTestGateway({ models: [staticModel('http://127.0.0.1:9')] });
  delete process.env.SVC_TRUSTED_PROXIES;
  try {
    const from = (client: string, authorization: string) => fetch(`${proxied.url}/v1/models`, { headers: { authorization, 'x-forwarded-for': client } });
    for (let i = 0; i < 5; i++) assert.is((await from('198.51.100.7', wrongKey)).status, 401);
    assert.is((await from('198.51.100.7', wrongKey)).status, 429);
    assert.is((await from('198.51.100.8', `Bearer ${proxied.apiKey}`)).status, 200, 'another client behind the same proxy');
  } finally {
    await proxied.stop();
  }
});

it.run();
