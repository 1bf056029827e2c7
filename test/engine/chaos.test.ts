// Failure modes on demand: only with the chaos flag; each mode shaped like the vLLM failure it imitates.
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startReferenceEngine } from '../../src/reference-engine/index.ts';
import { configuredModel, post } from './helpers.ts';

const model = configuredModel('ref-byte');
const body = { prompt: 'hi', max_tokens: 4, temperature: 0 };

const plain = suite('chaos route without the flag');
plain('does not exist', async () => {
  const engine = await startReferenceEngine(model);
  try {
    const r = await post(`${engine.url}/_chaos`, { mode: 'error500' });
    assert.is(r.status, 404);
  } finally {
    await engine.close();
  }
});
plain.run();

const chaos = suite('chaos modes');
const ctx = { url: '', close: async () => {} };
chaos.before(async () => {
  Object.assign(ctx, await startReferenceEngine(model, { chaos: true }));
});
chaos.after(() => ctx.close());
const arm = (mode: string, extra: Record<string, unknown> = {}) => post(`${ctx.url}/_chaos`, { mode, ...extra });
const complete = () => post(`${ctx.url}/v1/completions`, body);

chaos('error500 fails the next N completions, then the engine recovers', async () => {
  assert.is((await arm('error500', { count: 2 })).status, 200);
  for (let i = 0; i < 2; i++) {
    const r = await complete();
    assert.is(r.status, 500);
    assert.is(r.json.error.type, 'InternalServerError');
    assert.is(r.json.error.code, 500);
  }
  assert.is((await complete()).status, 200);
});

chaos('oom answers a 500 whose message is CUDA out of memory', async () => {
  await arm('oom');
  const r = await complete();
  assert.is(r.status, 500);
  assert.match(r.json.error.message, /CUDA out of memory/);
});

chaos('dead answers 503 and /health says 503 until reset', async () => {
  await arm('dead');
  const r = await complete();
  assert.is(r.status, 503);
  assert.is(r.json.error.code, 503);
  assert.is((await fetch(`${ctx.url}/health`)).status, 503);
  await arm('none');
  assert.is((await fetch(`${ctx.url}/health`)).status, 200);
  assert.is((await complete()).status, 200);
});

chaos('delay slows every token but completes normally', async () => {
  await arm('delay', { delay_ms: 5 });
  const r = await complete();
  assert.is(r.status, 200);
  assert.is(r.json.usage.completion_tokens, 4);
});

chaos('hang never answers while other requests are served', async () => {
  await arm('hang');
  const abort = new AbortController();
  let settled = false;
  const hung = fetch(`${ctx.url}/v1/completions`, { method: 'POST', body: JSON.stringify(body), signal: abort.signal }).then(
    () => (settled = true),
    () => (settled = true),
  );
  assert.is((await complete()).status, 200);
  assert.is((await fetch(`${ctx.url}/health`)).status, 200);
  assert.not.ok(settled);
  abort.abort();
  await hung;
});

chaos('running answers when the count of generations is reached, and counts those cut short by their client', async () => {
  const running = (count: number) => post(`${ctx.url}/_chaos/running`, { count });
  const idle = await running(0);
  assert.equal(idle.json, { running: 0, cancelled: idle.json.cancelled });
  await arm('delay', { delay_ms: 1_000 });
  const client = new AbortController();
  const pending = fetch(`${ctx.url}/v1/completions`, { method: 'POST', body: JSON.stringify(body), signal: client.signal }).catch(() => undefined);
  assert.is((await running(1)).json.running, 1);
  client.abort();
  await pending;
  const after = await running(0);
  assert.is(after.json.cancelled, idle.json.cancelled + 1);
  assert.is((await running(-1)).status, 400);
});

chaos('a generation cancelled during a delay stops running at once, not a delay later', async () => {
  const running = (count: number) => post(`${ctx.url}/_chaos/running`, { count });
  await arm('delay', { delay_ms: 60_000 });
  const client = new AbortController();
  const pending = fetch(`${ctx.url}/v1/completions`, { method: 'POST', body: JSON.stringify(body), signal: client.signal }).catch(() => undefined);
  await running(1);
  client.abort();
  await pending;
  // Within a tenth of the delay (a minute's sleep per token before): the delay is a sleep, not work.
  const ended = await Promise.race([running(0).then(() => true), new Promise<boolean>((resolve) => setTimeout(resolve, 6_000, false).unref())]);
  await arm('none');
  assert.ok(ended, 'the cancelled generation still counted as running 6 s after its client left');
});

chaos('crash drops the connection mid-request and the engine stops answering', async () => {
  await arm('crash');
  let failed = false;
  try {
    const res = await fetch(`${ctx.url}/v1/completions`, { method: 'POST', body: JSON.stringify({ ...body, stream: true }) });
    await res.text();
  } catch {
    failed = true;
  }
  assert.ok(failed);
  let refused = false;
  try {
    await fetch(`${ctx.url}/health`);
  } catch {
    refused = true;
  }
  assert.ok(refused);
});

chaos.run();

const tear = suite('tear');
tear('a stream gets its first frame, then half a frame, then the connection drops', async () => {
  const engine = await startReferenceEngine(model, { chaos: true });
  try {
    await post(`${engine.url}/_chaos`, { mode: 'tear' });
    const res = await fetch(`${engine.url}/v1/completions`, { method: 'POST', body: JSON.stringify({ ...body, stream: true }) });
    const reader = res.body!.getReader();
    let text = '';
    let broke = false;
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        text += Buffer.from(value).toString('utf8');
      }
    } catch {
      broke = true;
    }
    assert.ok(broke, 'the connection broke');
    const [first, torn, ...rest] = text.split('\n\n');
    assert.is(JSON.parse(first.slice('data: '.length)).object, 'text_completion');
    assert.match(torn, /^data: \{"id":"cmpl-[0-9a-f]+","object":"text_completion","choi$/);
    assert.equal(rest, []);
  } finally {
    await engine.close();
  }
});
tear('a non-streaming body gets its headers and first bytes, then the connection drops', async () => {
  const engine = await startReferenceEngine(model, { chaos: true });
  try {
    await post(`${engine.url}/_chaos`, { mode: 'tear' });
    const res = await fetch(`${engine.url}/v1/completions`, { method: 'POST', body: JSON.stringify(body) });
    assert.is(res.status, 200, 'the status line went out');
    assert.ok(Number(res.headers.get('content-length')) > 0);
    let broke = false;
    await res.arrayBuffer().catch(() => (broke = true));
    assert.ok(broke, 'the body broke off before its Content-Length');
  } finally {
    await engine.close();
  }
});

tear('chaosMode arms a mode at start: the first completion fails, the next is served', async () => {
  const engine = await startReferenceEngine(model, { chaos: true, chaosMode: 'error500' });
  try {
    assert.is((await post(`${engine.url}/v1/completions`, body)).status, 500);
    assert.is((await post(`${engine.url}/v1/completions`, body)).status, 200);
  } finally {
    await engine.close();
  }
});
tear.run();

const boot = suite('slow boot');
boot('bootDelayMs delays listening', async () => {
  let listening = false;
  const starting = startReferenceEngine(model, { chaos: true, bootDelayMs: 300 }).then((e) => {
    listening = true;
    return e;
  });
  await new Promise((r) => setImmediate(r));
  assert.not.ok(listening);
  const engine = await starting;
  assert.is((await fetch(`${engine.url}/health`)).status, 200);
  await engine.close();
});
boot.run();
