import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { loadSettings } from '../../src/config/index.ts';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';
import { until } from '../support/until.ts';

// Metadata only: a prompt sent in a request never appears in the logs or in the store.
const logging = suite('no prompt or completion in logs or store');
let gw: TestGateway;
const marker = `SECRETPROMPT${Date.now().toString(36)}`;
// ref-byte only: nothing here calls ref-gpt2, whose engine would start for nothing.
const models = loadSettings().models.filter((m) => m.id === 'ref-byte');

logging.before(async () => {
  gw = await startTestGateway({ models });
});
logging.after(async () => {
  await gw?.stop();
});

function filesUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? filesUnder(path) : [path];
  });
}

logging('requests of every kind leave only metadata behind', async () => {
  const post = (body: string, headers: Record<string, string> = {}) =>
    fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...gw.authHeaders(), ...headers }, body });
  const responses = [
    await post(JSON.stringify({ prompt: `${marker} plain`, max_tokens: 4, temperature: 0 })),
    await post(JSON.stringify({ prompt: `${marker} streamed`, max_tokens: 4, temperature: 0, stream: true })),
    await post(JSON.stringify({ prompt: [`${marker} batch`, 'two'], max_tokens: 2 })),
    await post(JSON.stringify({ prompt: `${marker} echo`, max_tokens: 2, echo: true, logprobs: 1 })),
    await post(JSON.stringify({ prompt: marker, [`${marker}field`]: marker })),
    await post(`{"prompt": "${marker}`),
    await post(JSON.stringify({ prompt: marker, max_tokens: 2 }), { 'x-request-id': 'logging-test-1', 'x-svc-workload': 'batch' }),
    await post(JSON.stringify({ prompt: marker, max_tokens: 2 }), { 'x-request-id': 'logging-test-2', 'x-svc-workload': 'urgent!' }),
    await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ messages: [{ role: 'user', content: marker }] }) }),
    await post(JSON.stringify({ prompt: marker, max_tokens: 2 }), { authorization: `Bearer sk-${marker}` }),
    await post(JSON.stringify({ prompt: marker, max_tokens: 2 }), { authorization: `Bearer svc_${'0'.repeat(12)}_${marker.padEnd(43, 'x').slice(0, 43)}` }),
  ];
  const statuses = [];
  for (const res of responses) {
    statuses.push(res.status);
    await res.arrayBuffer();
  }
  assert.equal(statuses, [200, 200, 200, 200, 400, 400, 200, 200, 400, 401, 401]);

  await gw.close();
  const logs = gw.logs();
  assert.ok(logs.includes('logging-test-1'), 'request metadata is logged');
  assert.ok(logs.includes('"route":"/v1/completions"'));
  const line = (id: string) => JSON.parse(logs.split('\n').find((l) => l.includes(`"request_id":"${id}"`))!);
  const requestLines = logs.split('\n').filter((l) => l.includes('"msg":"request"'));
  assert.is(requestLines.length, responses.length + 1, 'exactly one line per request (and one for issuing the key)');
  assert.is(new Set(requestLines.map((l) => JSON.parse(l).request_id)).size, requestLines.length, 'each request id once');
  const served = line('logging-test-1');
  assert.is(served.model, 'ref-byte', 'the model that served');
  assert.is(served.status, 200);
  // max_tokens 2, sampled (no temperature): the reference engine may draw its end-of-sequence token first.
  assert.ok(served.completion_tokens === 1 || served.completion_tokens === 2, `the tokens generated: ${served.completion_tokens}`);
  assert.ok(served.prompt_tokens > 0);
  assert.ok(served.duration_ms >= 0);
  // The contract's logged metadata includes the user's e-mail and the client's IP (as usage_ledger has them).
  assert.is(served.email, 'tests@example.org', "the key's owner");
  assert.is(served.client_ip, '127.0.0.1', "the client's address");
  const refused = requestLines.map((l) => JSON.parse(l)).filter((l) => l.status === 401);
  assert.is(refused.length, 2);
  for (const l of refused) {
    assert.is(l.email, undefined, 'no key authenticated: no owner');
    assert.is(l.client_ip, '127.0.0.1');
  }
  assert.is(line('logging-test-1').workload, 'batch', 'X-Svc-Workload is recorded as telemetry');
  assert.is(line('logging-test-2').workload, undefined, 'an unrecognised workload is ignored');
  assert.not.ok(logs.includes(marker), 'the prompt, a field name made of it, or the key never reaches the logs');

  const secret = gw.apiKey.slice('svc_'.length + 13);
  assert.not.ok(logs.includes(secret), 'the API key in use never reaches the logs');
  for (const file of filesUnder(gw.dataDir)) {
    assert.not.ok(readFileSync(file).includes(marker), `${file} holds no prompt`);
    assert.not.ok(readFileSync(file).includes(secret), `${file} holds no API key`);
  }
});

logging.run();

// One line per request, written when it ends: a stream's line comes after its last frame, and a client
// that left shows as 499 (nginx's "client closed request").
const ended = suite('one request line when the request ends');
let chaos: TestGateway;

ended.before(async () => {
  // A short grace: the request left hanging at the engine holds the drain until it (a known limit of drainAndClose).
  chaos = await startTestGateway({ models, shutdownGraceMs: 2_000 }, { chaosEngines: true });
});
ended.after(async () => {
  await chaos?.stop();
});

const requestLines = (id: string) =>
  chaos
    .logs()
    .split('\n')
    .filter((l) => l.includes(`"request_id":"${id}"`) && l.includes('"msg":"request"'))
    .map((l) => JSON.parse(l));

async function engineChaos(body: Record<string, unknown>): Promise<void> {
  const res = await fetch(`${chaos.engineUrls.get('ref-byte')}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  assert.is(res.status, 200);
}

function complete(id: string, body: Record<string, unknown>, signal?: AbortSignal): Promise<Response> {
  return fetch(`${chaos.url}/v1/completions`, {
    method: 'POST',
    headers: chaos.authHeaders({ 'content-type': 'application/json', 'x-request-id': id }),
    body: JSON.stringify(body),
    signal,
  });
}

/** The request's lines once one is there, and again a moment later (a second one would be a fault). */
async function onlyLine(id: string): Promise<Record<string, any>> {
  await until(`the log line of ${id}`, async () => requestLines(id).length > 0, 10_000, 20);
  await new Promise((r) => setTimeout(r, 300));
  const lines = requestLines(id);
  assert.is(lines.length, 1, `exactly one line for ${id}`);
  return lines[0];
}

ended('a stream that ran to its end: its whole duration and its tokens', async () => {
  // Every token of the next generation takes 50 ms: a line written with the headers would show a short duration.
  await engineChaos({ mode: 'delay', delay_ms: 50, count: 1 });
  const res = await complete('ended-stream', { prompt: 'hello', max_tokens: 8, temperature: 0, stream: true });
  assert.is(res.status, 200);
  await res.text();
  const line = await onlyLine('ended-stream');
  assert.is(line.status, 200);
  assert.is(line.route, '/v1/completions');
  assert.is(line.method, 'POST');
  assert.is(line.model, 'ref-byte');
  assert.ok(chaos.apiKey.startsWith(`svc_${line.key_prefix}_`), 'the key prefix');
  assert.ok(line.duration_ms >= 8 * 50 - 50, `duration ${line.duration_ms} ms covers the stream`);
  assert.is(line.completion_tokens, 8);
  assert.ok(line.prompt_tokens > 0);
});

ended('a client that leaves before the first byte: one line, 499', async () => {
  await engineChaos({ mode: 'hang', count: 1 });
  const client = new AbortController();
  const sent = complete('left-before-first-byte', { prompt: 'hello', max_tokens: 8, stream: true }, client.signal);
  setTimeout(() => client.abort(), 300);
  await sent.then(
    () => assert.unreachable('no headers came before the client left'),
    (err) => assert.is((err as Error).name, 'AbortError'),
  );
  const line = await onlyLine('left-before-first-byte');
  assert.is(line.status, 499);
  assert.is(line.model, 'ref-byte');
  assert.is(line.completion_tokens, 0);
  // the time it was open for the gateway: from its arrival (later than the client's send on a busy machine) to the client leaving
  assert.ok(line.duration_ms > 0, `${line.duration_ms} ms`);
});

ended('a client that leaves mid-stream: one line, 499, with the tokens relayed until then', async () => {
  await engineChaos({ mode: 'delay', delay_ms: 100, count: 1 });
  const client = new AbortController();
  const res = await complete('left-mid-stream', { prompt: 'hello', max_tokens: 40, temperature: 0, stream: true }, client.signal);
  assert.is(res.status, 200);
  const reader = res.body!.getReader();
  const first = await reader.read();
  assert.ok(first.value && first.value.length > 0, 'the stream started');
  client.abort();
  await reader.read().catch(() => {});
  const line = await onlyLine('left-mid-stream');
  assert.is(line.status, 499);
  assert.ok(line.completion_tokens >= 1 && line.completion_tokens < 40, `${line.completion_tokens} tokens relayed before the client left`);
});

ended('nothing of the prompt in these lines', async () => {
  assert.not.ok(chaos.logs().includes('hello'), 'metadata only');
});

ended.run();
