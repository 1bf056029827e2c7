/**
 * A stream the client leaves is billed for what the engine generated, and the settlement records both
 * counts: generated (billed) and relayed (the frames the client's socket took). A real gateway, a
 * reference engine slowed per token, a client that reads a few frames and leaves; then the event, the
 * usage_ledger row and `svc audit statement` each show both. A stream that runs to its end has neither.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';
import { loadSettings } from '../../src/config/index.ts';
import { until } from '../support/until.ts';
import { runAuditCommand } from '../../src/cli/audit.ts';

const it = suite('a stream cut short: generated and relayed tokens');
let gw: TestGateway;

it.before(async () => {
  // ref-byte only: nothing here calls ref-gpt2, whose engine would start for nothing.
  gw = await startTestGateway({ models: loadSettings().models.filter((m) => m.id === 'ref-byte'), shutdownGraceMs: 2_000 }, { chaosEngines: true });
});
it.after(async () => {
  await gw?.stop();
});

async function slowEngine(delayMs: number): Promise<void> {
  const res = await fetch(`${gw.engineUrls.get('ref-byte')}/_chaos`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ mode: 'delay', delay_ms: delayMs, count: 1 }) });
  assert.is(res.status, 200);
}

function complete(id: string, body: Record<string, unknown>, signal?: AbortSignal): Promise<Response> {
  return fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: gw.authHeaders({ 'content-type': 'application/json', 'x-request-id': id }), body: JSON.stringify(body), signal });
}

interface Settled {
  request_id: string;
  output_tokens: number;
  basis: string;
  disconnected: boolean;
  generated_output_tokens: number | null;
  relayed_output_tokens: number | null;
}

/** The request's settlement (its meter request id is the client's X-Request-Id with a suffix of ours). */
async function settlementOf(id: string): Promise<Settled> {
  return until(`the settlement of ${id}`, async () => {
    await gw.commands.settled();
    const { rows } = await gw.store.query<{ data: Settled }>(`SELECT data FROM events WHERE event_type = 'UsageSettled' AND data->>'request_id' LIKE $1`, [`${id}.%`]);
    return rows[0]?.data ?? null;
  }, 10_000, 20);
}

const keyPrefix = () => gw.apiKey.split('_')[1];

async function statementLines(): Promise<Map<string, Record<string, unknown>>> {
  let out = '';
  let err = '';
  const code = await runAuditCommand(['statement', '--key', keyPrefix(), '--format', 'json'], { store: gw.store, stdout: { write: (t: string) => (out += t) }, stderr: { write: (t: string) => (err += t) } });
  assert.is(code, 0, `the statement agrees with usage_ledger: ${err}`);
  const lines = (JSON.parse(out) as { lines: Record<string, unknown>[] }).lines;
  return new Map(lines.map((l) => [String(l.request_id), l]));
}

async function statementCsv(): Promise<string[]> {
  let out = '';
  const code = await runAuditCommand(['statement', '--key', keyPrefix()], { store: gw.store, stdout: { write: (t: string) => (out += t) }, stderr: { write: () => true } });
  assert.is(code, 0);
  return out.trimEnd().split('\r\n');
}

it('a client that reads a few frames and leaves: billed what was generated, generated ≥ relayed ≥ what it read, in the event, the ledger and the statement', async () => {
  await slowEngine(100);
  const client = new AbortController();
  const res = await complete('left-after-three', { prompt: 'hello', max_tokens: 40, temperature: 0, stream: true }, client.signal);
  assert.is(res.status, 200);
  const reader = res.body!.getReader();
  const decoder = new TextDecoder();
  let text = '';
  const framesRead = () => text.split('\n\n').slice(0, -1).filter((f) => f.startsWith('data: {') && !f.includes('"error"')).length;
  while (framesRead() < 3) {
    const { value, done } = await reader.read();
    assert.not.ok(done, 'the stream ran long enough');
    text += decoder.decode(value, { stream: true });
  }
  const read = framesRead();
  client.abort();
  await reader.read().catch(() => {});

  const settled = await settlementOf('left-after-three');
  assert.equal([settled.disconnected, settled.basis], [true, 'relayed_frames']);
  assert.ok(settled.generated_output_tokens !== null && settled.relayed_output_tokens !== null, 'both recorded');
  assert.is(settled.output_tokens, settled.generated_output_tokens, 'billed what was generated');
  assert.ok(settled.generated_output_tokens! >= settled.relayed_output_tokens!, `generated ${settled.generated_output_tokens} ≥ relayed ${settled.relayed_output_tokens}`);
  assert.ok(settled.relayed_output_tokens! >= read, `relayed ${settled.relayed_output_tokens} ≥ the ${read} frames the client read`);
  assert.ok(settled.generated_output_tokens! < 40, 'the generation was cancelled');

  await gw.projectionsCaughtUp();
  const { rows } = await gw.store.query<{ generated_output_tokens: string | number; relayed_output_tokens: string | number; output_tokens: string | number }>(
    'SELECT generated_output_tokens, relayed_output_tokens, output_tokens FROM usage_ledger WHERE request_id = $1',
    [settled.request_id],
  );
  assert.equal(rows.map((r) => [Number(r.generated_output_tokens), Number(r.relayed_output_tokens), Number(r.output_tokens)]), [[settled.generated_output_tokens, settled.relayed_output_tokens, settled.output_tokens]]);

  const line = (await statementLines()).get(settled.request_id)!;
  assert.equal([line.generated_output_tokens, line.relayed_output_tokens], [settled.generated_output_tokens, settled.relayed_output_tokens]);
  const csv = await statementCsv();
  const header = csv[0].split(',');
  const row = csv.find((l) => l.startsWith(`${settled.request_id},`))!.split(',');
  assert.equal(
    [row[header.indexOf('generated_output_tokens')], row[header.indexOf('relayed_output_tokens')]],
    [String(settled.generated_output_tokens), String(settled.relayed_output_tokens)],
  );
});

it('a stream that runs to its end, and a non-streaming request: neither count recorded (null)', async () => {
  const streamed = await complete('ran-to-the-end', { prompt: 'hello', max_tokens: 6, temperature: 0, stream: true });
  assert.is(streamed.status, 200);
  await streamed.text();
  const whole = await complete('not-a-stream', { prompt: 'hello', max_tokens: 3, temperature: 0 });
  assert.is(whole.status, 200);
  await whole.text();
  for (const id of ['ran-to-the-end', 'not-a-stream']) {
    const settled = await settlementOf(id);
    assert.equal([settled.disconnected, settled.generated_output_tokens, settled.relayed_output_tokens], [false, null, null], id);
  }
  await gw.projectionsCaughtUp();
  const { rows } = await gw.store.query<{ request_id: string; generated_output_tokens: unknown; relayed_output_tokens: unknown }>(
    `SELECT request_id, generated_output_tokens, relayed_output_tokens FROM usage_ledger WHERE request_id LIKE 'ran-to-the-end.%' OR request_id LIKE 'not-a-stream.%'`,
  );
  assert.equal(rows.map((r) => [r.generated_output_tokens, r.relayed_output_tokens]), [[null, null], [null, null]]);
  const lines = await statementLines();
  for (const r of rows) assert.equal([lines.get(r.request_id)!.generated_output_tokens, lines.get(r.request_id)!.relayed_output_tokens], [null, null]);
});

it.run();
