import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import SwaggerParser from '@apidevtools/swagger-parser';
import { projections } from '../../projections/index.ts';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';

// Keys end to end: the auth hook on the protected routes, the admin API and its lifecycle, over real HTTP.
const keys = suite('API keys over HTTP (auth hook, admin API)');
let gw: TestGateway;

keys.before(async () => {
  // This suite sends dozens of wrong tokens on purpose, from one address: without the failed-authentication
  // limit, which test/api/auth-failures.test.ts covers.
  gw = await startTestGateway({ authFailures: { limit: 0, windowMs: 60_000 } });
});
keys.after(async () => {
  await gw?.stop();
});

const protectedRoutes = [
  { method: 'POST', path: '/v1/completions', body: JSON.stringify({ prompt: 'hi', max_tokens: 1, temperature: 0 }) },
  { method: 'GET', path: '/v1/models' },
  { method: 'GET', path: '/v1/models/ref-byte/status' },
];

function call(route: { method: string; path: string; body?: string }, headers: Record<string, string> = {}) {
  return fetch(`${gw.url}${route.path}`, { method: route.method, headers: { ...(route.body ? { 'content-type': 'application/json' } : {}), ...headers }, body: route.body });
}

function admin(method: string, path: string, body?: unknown, token = gw.adminToken) {
  return fetch(`${gw.url}${path}`, {
    method,
    headers: { authorization: `Bearer ${token}`, ...(body !== undefined ? { 'content-type': 'application/json' } : {}) },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
}

async function assertError(res: Response, status: number, code: string, what: string): Promise<any> {
  const body = await json(res);
  assert.is(res.status, status, `${what}: ${JSON.stringify(body)}`);
  assert.is(body.error.code, code, what);
  assert.ok(body.error.message && body.error.type, what);
  assert.ok(res.headers.get('x-request-id'), what);
  assert.is(body.request_id, res.headers.get('x-request-id'), what);
  return body;
}

async function issue(body: Record<string, unknown> = { email: 'lifecycle@example.org' }): Promise<any> {
  const res = await admin('POST', '/admin/keys', body);
  const created = await json(res);
  assert.is(res.status, 201, JSON.stringify(created));
  return created;
}

keys('every protected route: 401 invalid_api_key for a missing, malformed, unknown, wrong, paused or revoked key', async () => {
  const paused = await issue({ email: 'paused@example.org' });
  assert.is((await admin('POST', `/admin/keys/${paused.prefix}/pause`)).status, 200);
  const revoked = await issue({ email: 'revoked@example.org' });
  assert.is((await admin('POST', `/admin/keys/${revoked.prefix}/revoke`)).status, 200);
  const [, prefix, secret] = /^svc_([0-9a-f]{12})_(.{43})$/.exec(gw.apiKey)!;
  const flipped = `${secret.slice(0, 20)}${secret[20] === 'a' ? 'b' : 'a'}${secret.slice(21)}`;
  const cases: [string, Record<string, string>][] = [
    ['missing', {}],
    ['empty bearer', { authorization: 'Bearer ' }],
    ['basic auth', { authorization: 'Basic dXNlcjpwYXNz' }],
    ['malformed', { authorization: 'Bearer sk-1234' }],
    ['unknown prefix', { authorization: `Bearer svc_ffffffffffff_${secret}` }],
    ['wrong secret', { authorization: `Bearer svc_${prefix}_${flipped}` }],
    ['the admin token', { authorization: `Bearer ${gw.adminToken}` }],
    ['paused', { authorization: `Bearer ${paused.key}` }],
    ['revoked', { authorization: `Bearer ${revoked.key}` }],
  ];
  for (const route of protectedRoutes) {
    for (const [name, headers] of cases) await assertError(await call(route, headers), 401, 'invalid_api_key', `${route.method} ${route.path} ${name}`);
    const ok = await call(route, gw.authHeaders());
    assert.is(ok.status, 200, `${route.method} ${route.path} with a good key`);
    await ok.arrayBuffer();
  }
});

keys('a 401 comes before any body is judged; the public routes need no key', async () => {
  const bad = await fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{not json' });
  await assertError(bad, 401, 'invalid_api_key', 'unauthenticated bad JSON');
  for (const path of ['/health', '/openapi.json', '/admin/openapi.json', '/swagger']) {
    const res = await fetch(`${gw.url}${path}`, { redirect: 'follow' });
    assert.is(res.status, 200, path);
    await res.arrayBuffer();
  }
  const chat = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
  await assertError(chat, 400, 'chat_completions_unsupported', 'chat needs no key');
});

keys('admin routes: a missing or wrong admin token is 401 in the envelope; an API key is not an admin token', async () => {
  const routes: [string, string, unknown?][] = [
    ['POST', '/admin/keys', { email: 'x@example.org' }],
    ['GET', '/admin/keys'],
    ['GET', '/admin/keys/aaaaaaaaaaaa'],
    ['PATCH', '/admin/keys/aaaaaaaaaaaa', { daily_token_budget: 1 }],
    ['POST', '/admin/keys/aaaaaaaaaaaa/pause'],
    ['POST', '/admin/keys/aaaaaaaaaaaa/resume'],
    ['POST', '/admin/keys/aaaaaaaaaaaa/revoke'],
  ];
  for (const [method, path, body] of routes) {
    const none = await fetch(`${gw.url}${path}`, { method, ...(body ? { headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) } : {}) });
    await assertError(none, 401, 'invalid_api_key', `${method} ${path} without a token`);
    for (const token of [`${gw.adminToken}x`, gw.adminToken.slice(0, -1), gw.apiKey, 'x']) {
      await assertError(await admin(method, path, body, token), 401, 'invalid_api_key', `${method} ${path} with a wrong token`);
    }
  }
});

keys('lifecycle over HTTP: create, use, pause (401), resume, revoke (401 for good)', async () => {
  const created = await issue({ email: 'grace@example.org', monthly_token_budget: 100000, daily_token_budget: null });
  assert.match(created.key, /^svc_[0-9a-f]{12}_[A-Za-z0-9_-]{43}$/);
  assert.is(created.key.slice(4, 16), created.prefix);
  assert.is(created.key_id, created.prefix);
  assert.is(created.user_id, 'grace@example.org', 'user_id defaults to the e-mail');
  assert.is(created.status, 'active');
  assert.is(created.monthly_token_budget, 100000);
  assert.is(created.daily_token_budget, null);
  assert.is(created.monthly_harvest_jobs, null);
  assert.ok(!Number.isNaN(Date.parse(created.issued_at)));
  const auth = { authorization: `Bearer ${created.key}` };
  const use = async () => (await call(protectedRoutes[0], auth)).status;

  assert.is(await use(), 200);
  const shown = await json(await admin('GET', `/admin/keys/${created.prefix}`));
  assert.not.ok('key' in shown, 'the full key is shown only once');
  assert.is(shown.email, 'grace@example.org');
  assert.equal(shown.usage.period, new Date().toISOString().slice(0, 7));

  const paused = await json(await admin('POST', `/admin/keys/${created.prefix}/pause`));
  assert.is(paused.status, 'paused');
  assert.is(await use(), 401);
  assert.is((await json(await admin('GET', `/admin/keys/${created.prefix}`))).status, 'paused', 'read after write');
  assert.is((await json(await admin('POST', `/admin/keys/${created.prefix}/pause`))).status, 'paused', 'pausing twice changes nothing');

  assert.is((await json(await admin('POST', `/admin/keys/${created.prefix}/resume`))).status, 'active');
  assert.is(await use(), 200);

  assert.is((await json(await admin('POST', `/admin/keys/${created.prefix}/revoke`))).status, 'revoked');
  assert.is(await use(), 401);
  await assertError(await admin('POST', `/admin/keys/${created.prefix}/resume`), 409, 'key_revoked', 'resume after revoke');
  await assertError(await admin('PATCH', `/admin/keys/${created.prefix}`, { daily_token_budget: 5 }), 409, 'key_revoked', 'budgets after revoke');
  assert.is(await use(), 401, 'still revoked');

  const list = await json(await admin('GET', '/admin/keys'));
  assert.is(list.object, 'list');
  const row = list.data.find((k: any) => k.prefix === created.prefix);
  assert.ok(row, 'a key just issued is listed (the list waits for the projection)');
  assert.is(row.status, 'revoked', 'and shows its latest status');
  assert.is(row.monthly_token_budget, 100000);
  assert.ok(list.data.some((k: any) => k.prefix === gw.apiKey.slice(4, 16)), 'the test gateway\'s own key too');
  if (!projections.some((p) => p.name === 'key_usage')) {
    for (const k of list.data) assert.equal(k.usage, { period: new Date().toISOString().slice(0, 7), input_tokens: 0, output_tokens: 0, total_tokens: 0, reserved_tokens: 0, requests: 0 });
  }
  const line = gw.logs().split('\n').find((l) => l.includes('"route":"/v1/completions"') && l.includes(created.prefix));
  assert.ok(line, 'the request log names the key prefix');
});

keys('unknown prefix 404, malformed prefix 400, strict bodies: unknown fields, negatives, fractions, bad e-mail are 400', async () => {
  await assertError(await admin('GET', '/admin/keys/0123456789ab'), 404, 'not_found', 'unknown');
  for (const action of ['pause', 'resume', 'revoke']) await assertError(await admin('POST', `/admin/keys/0123456789ab/${action}`), 404, 'not_found', action);
  await assertError(await admin('PATCH', '/admin/keys/0123456789ab', { daily_token_budget: 1 }), 404, 'not_found', 'patch unknown');
  await assertError(await admin('GET', '/admin/keys/NOT-A-PREFIX'), 400, 'invalid_request', 'malformed');

  const bad: [unknown, RegExp][] = [
    [{}, /email: is required/],
    [{ email: 'no-at-sign' }, /email/],
    [{ email: 'a@example.org', monthly_token_budget: -1 }, /monthly_token_budget: must be a non-negative integer, or null/],
    [{ email: 'a@example.org', daily_token_budget: 1.5 }, /daily_token_budget/],
    [{ email: 'a@example.org', daily_token_budget: '5' }, /daily_token_budget/],
    [{ email: 'a@example.org', budget: 5 }, /unknown field: budget/],
    [[], /body: must be a JSON object/],
  ];
  for (const [body, message] of bad) {
    const error = await assertError(await admin('POST', '/admin/keys', body), 400, 'invalid_request', JSON.stringify(body));
    assert.match(error.error.message, message);
  }
  await assertError(await admin('POST', '/admin/keys', '{oops'), 400, 'bad_json', 'bad JSON');

  const key = await issue({ email: 'budget@example.org', user_id: 'team-7', monthly_input_token_budget: 10 });
  assert.is(key.user_id, 'team-7');
  const patchBad: [unknown, RegExp][] = [
    [{}, /at least one budget/],
    [{ monthly_token_budget: -5 }, /monthly_token_budget/],
    [{ email: 'x@example.org' }, /unknown field: email/],
    [{ status: 'active' }, /unknown field: status/],
    [{ monthly_harvest_jobs: 2.5 }, /monthly_harvest_jobs/],
  ];
  for (const [body, message] of patchBad) {
    const error = await assertError(await admin('PATCH', `/admin/keys/${key.prefix}`, body), 400, 'invalid_request', JSON.stringify(body));
    assert.match(error.error.message, message);
  }
  const patched = await json(await admin('PATCH', `/admin/keys/${key.prefix}`, { monthly_input_token_budget: null, monthly_output_token_budget: 20, daily_token_budget: 0 }));
  assert.is(patched.monthly_input_token_budget, null, 'null makes a budget unlimited');
  assert.is(patched.monthly_output_token_budget, 20);
  assert.is(patched.daily_token_budget, 0);
  const reread = await json(await admin('GET', `/admin/keys/${key.prefix}`));
  assert.equal([reread.monthly_input_token_budget, reread.monthly_output_token_budget, reread.daily_token_budget], [null, 20, 0]);
});

keys('the admin API has its own OpenAPI document; the public one stays free of it', async () => {
  const doc = await json(await fetch(`${gw.url}/admin/openapi.json`));
  await SwaggerParser.validate(structuredClone(doc));
  assert.equal(Object.keys(doc.paths).sort(), ['/admin/keys', '/admin/keys/{prefix}', '/admin/keys/{prefix}/pause', '/admin/keys/{prefix}/resume', '/admin/keys/{prefix}/revoke']);
  assert.ok(doc.paths['/admin/keys'].post.tags.includes('admin'));
  const pub = await json(await fetch(`${gw.url}/openapi.json`));
  assert.not.ok(Object.keys(pub.paths).some((p) => p.startsWith('/admin')));
});

function filesUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? filesUnder(path) : [path];
  });
}

keys('a key\'s secret never appears in the logs, the events, the tables or the data directory', async () => {
  const created = await issue({ email: 'scan@example.org' });
  const secret = created.key.slice(17);
  assert.is(secret.length, 43);
  assert.is((await call(protectedRoutes[0], { authorization: `Bearer ${created.key}` })).status, 200);
  assert.is((await call(protectedRoutes[1], { authorization: `Bearer ${created.key}x` })).status, 401);
  await admin('POST', `/admin/keys/${created.prefix}/pause`);
  const { rows: events } = await gw.store.query('SELECT * FROM events');
  assert.ok(events.some((e: any) => e.stream_id === `key-${created.prefix}`));
  const { rows: tables } = await gw.store.query(`SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()`);
  for (const { table_name } of tables as { table_name: string }[]) {
    const { rows } = await gw.store.query(`SELECT * FROM ${table_name}`);
    assert.not.ok(JSON.stringify(rows).includes(secret), `table ${table_name} holds no secret`);
  }
  await gw.close();
  for (const text of [gw.logs(), JSON.stringify(events)]) {
    assert.not.ok(text.includes(secret), 'no secret');
    assert.not.ok(text.includes(gw.apiKey.slice(17)), 'not the test key either');
  }
  for (const file of filesUnder(gw.dataDir)) assert.not.ok(readFileSync(file).includes(secret), `${file} holds no secret`);
});

keys.run();
