import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import SwaggerParser from '@apidevtools/swagger-parser';
import { Type } from 'typebox';
import type { FastifyInstance } from 'fastify';
import { adminSecurity, adminTag, buildApp, createLogger, errorResponses, okResponse } from '../../src/api/index.ts';
import { openEventStore, type EventStore } from '../../src/store/index.ts';

// The document is generated from the routes' own schemas: what a route validates is what it documents,
// and admin routes land in their own document.
const openapi = suite('OpenAPI generated from route schemas');
let store: EventStore;
let app: FastifyInstance;
let base: string;

const KeyRequest = Type.Object({ email: Type.String({ minLength: 3 }), monthly_token_budget: Type.Optional(Type.Integer({ minimum: 0 })) }, { additionalProperties: false });

openapi.before(async () => {
  store = await openEventStore({ inMemory: true });
  app = await buildApp({
    logger: createLogger('info', new Writable({ write: (_c, _e, cb) => cb() }) as never),
    health: { pingStore: (t) => store.ping(t), backends: () => [] },
    routes: (scope) => {
      scope.post(
        '/admin/keys',
        { schema: { tags: [adminTag], security: adminSecurity, body: KeyRequest, response: { 201: okResponse('The new key', Type.Object({ key: Type.String() })), ...errorResponses(400, 401) } } },
        async (_request, reply) => reply.code(201).send({ key: 'k' }),
      );
      scope.get('/v1/things/:thing_id', { schema: { params: Type.Object({ thing_id: Type.String({ pattern: '^[a-z]{1,8}$' }) }), response: errorResponses(400) } }, async () => ({ ok: true }));
    },
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  base = `http://127.0.0.1:${(app.server.address() as { port: number }).port}`;
});
openapi.after(async () => {
  await app?.close();
  await store?.close();
});

const getJson = async (path: string) => {
  const res = await fetch(`${base}${path}`);
  assert.is(res.status, 200, path);
  return res.json() as Promise<any>;
};

openapi('a route tagged admin is in /admin/openapi.json and not in /openapi.json; both documents are valid', async () => {
  const pub = await getJson('/openapi.json');
  const admin = await getJson('/admin/openapi.json');
  assert.equal(Object.keys(pub.paths).sort(), ['/health', '/v1/things/{thing_id}']);
  assert.equal(Object.keys(admin.paths), ['/admin/keys']);
  const create = admin.paths['/admin/keys'].post;
  assert.equal(create.security, [{ adminToken: [] }]);
  assert.equal(create.requestBody.content['application/json'].schema.required, ['email']);
  assert.is(create.requestBody.content['application/json'].schema.additionalProperties, false);
  assert.ok(create.responses['201'] && create.responses['401']);
  for (const doc of [pub, admin]) {
    assert.is(doc.info.version, '0.1.0');
    await SwaggerParser.validate(structuredClone(doc));
  }
});

openapi('a route schema validates: bad params and bodies are 400 invalid_request in the envelope, never a detail array', async () => {
  const badParam = await fetch(`${base}/v1/things/NOT-OK`);
  assert.is(badParam.status, 400);
  const body = (await badParam.json()) as any;
  assert.is(body.error.code, 'invalid_request');
  assert.match(body.error.message, /^thing_id: /);
  assert.is(body.request_id, badParam.headers.get('x-request-id'));
  assert.not.ok('detail' in body);

  const post = (payload: unknown) => fetch(`${base}/admin/keys`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(payload) });
  for (const [payload, message] of [
    [{}, /^body\.email: is required/],
    [{ email: 'a@b.c', extra: 1 }, /^body\.extra: unknown field/],
    [{ email: 'a@b.c', monthly_token_budget: -1 }, /^body\.monthly_token_budget: /],
  ] as const) {
    const res = await post(payload);
    assert.is(res.status, 400, JSON.stringify(payload));
    const err = (await res.json()) as any;
    assert.is(err.error.code, 'invalid_request');
    assert.match(err.error.message, message);
    assert.not.ok('detail' in err);
  }
  const ok = await post({ email: 'a@b.c', monthly_token_budget: 5 });
  assert.is(ok.status, 201);
  await ok.arrayBuffer();
});

openapi('the documented parameter is the validated one: its pattern comes from the route schema', async () => {
  const pub = await getJson('/openapi.json');
  const [param] = pub.paths['/v1/things/{thing_id}'].get.parameters;
  assert.is(param.name, 'thing_id');
  assert.is(param.schema.pattern, '^[a-z]{1,8}$');
  const served = await fetch(`${base}/v1/things/abc`);
  assert.is(served.status, 200, 'a value the documented pattern accepts is served');
  await served.arrayBuffer();
});

openapi('each documented error status names its codes, a code answered with another status (invalid_api_key at 403) included', () => {
  const description = (status: number) => (errorResponses(status)[status] as { description: string }).description;
  assert.is(description(403), 'Error envelope; error.code one of: invalid_api_key');
  assert.match(description(401), /: invalid_api_key$/);
  for (const status of [400, 401, 403, 404, 405, 409, 413, 429, 500, 502, 503, 504]) assert.not.match(description(status), /one of: $/, `status ${status}`);
});

openapi.run();
