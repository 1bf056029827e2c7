import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';

// Metadata only: a prompt sent in a request never appears in the logs or in the store.
const logging = suite('no prompt or completion in logs or store');
let gw: TestGateway;
const marker = `SECRETPROMPT${Date.now().toString(36)}`;

logging.before(async () => {
  gw = await startTestGateway();
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
