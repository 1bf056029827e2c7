import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import { buildApp, createLogger } from '../../src/api/index.ts';
import { openEventStore, StoreUnavailable, type EventStore } from '../../src/store/index.ts';

// An exception nobody anticipated still answers in the envelope, with a request id and no internal text.
const internal = suite('unhandled exceptions');
let store: EventStore;

internal.before(async () => {
  store = await openEventStore({ inMemory: true });
});
internal.after(async () => {
  await store.close();
});

internal('a throwing route answers 500 internal_error without its message or stack; the log keeps the stack', async () => {
  const lines: string[] = [];
  const logger = createLogger('info', new Writable({ write: (c, _e, cb) => (lines.push(String(c)), cb()) }) as never);
  const app = await buildApp({
    logger,
    health: { pingStore: (t) => store.ping(t), backends: () => [] },
    routes: (scope) => {
      scope.get('/v1/explode', async () => {
        throw new TypeError('secret internal detail at /srv/app.ts:42');
      });
    },
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  try {
    const { port } = app.server.address() as { port: number };
    const res = await fetch(`http://127.0.0.1:${port}/v1/explode`);
    assert.is(res.status, 500);
    const requestId = res.headers.get('x-request-id');
    assert.ok(requestId);
    const text = await res.text();
    assert.not.match(text, /secret|srv|TypeError/);
    const body = JSON.parse(text);
    assert.is(body.error.code, 'internal_error');
    assert.is(body.error.type, 'server_error');
    assert.is(body.request_id, requestId);
    const health = await fetch(`http://127.0.0.1:${port}/health`);
    assert.is(health.status, 200);
    await health.arrayBuffer();
  } finally {
    await app.close();
  }
  assert.ok(lines.some((l) => l.includes('secret internal detail')), 'the stack is logged for operators');
});

internal('a store that cannot be reached answers 503 store_unavailable with Retry-After, in the envelope', async () => {
  const logger = createLogger('silent');
  const app = await buildApp({
    logger,
    health: { pingStore: (t) => store.ping(t), backends: () => [] },
    routes: (scope) => {
      scope.get('/v1/store-down', async () => {
        throw new StoreUnavailable('the database did not answer within 10000 ms', true);
      });
    },
  });
  await app.listen({ port: 0, host: '127.0.0.1' });
  try {
    const { port } = app.server.address() as { port: number };
    const res = await fetch(`http://127.0.0.1:${port}/v1/store-down`);
    assert.is(res.status, 503);
    assert.is(res.headers.get('retry-after'), '5');
    const body = (await res.json()) as { error: { code: string }; request_id: string };
    assert.is(body.error.code, 'store_unavailable');
    assert.is(body.request_id, res.headers.get('x-request-id'));
  } finally {
    await app.close();
  }
});

internal.run();
