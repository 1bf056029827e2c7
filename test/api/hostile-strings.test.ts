/**
 * Hostile strings end to end: strings PostgreSQL's `jsonb` refuses (U+0000, lone surrogates)
 * and other awkward ones, in every client-controlled field that reaches an event (`user`, a refused
 * `model`, the key's e-mail and user id), sent as 1,000 completion bodies interleaved with valid requests
 * of other keys, through real HTTP on PGlite (and on PostgreSQL when DATABASE_URL is set, in a database
 * of its own). Nothing is answered 5xx, every request is recorded in the meter's events, and the strings
 * read back from the events are the ones sent, byte for byte; the projection tables keep up and
 * hold them in the log's escaped form. Headers cannot carry such strings (the
 * HTTP parser refuses U+0000, a header is Latin-1), a malformed X-Request-Id is replaced by a minted one,
 * and X-Svc-Workload records only `interactive` or `batch`; those stay out of the events by design.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { issueKey, startTestGateway, type TestGateway } from '../support/gateway.ts';
import { loadSettings } from '../../src/config/index.ts';
import { logStart, toStorableText, type RecordedEvent } from '../../src/store/index.ts';
import { within } from '../support/within.ts';

const hostile = [
  'x\u0000y',
  '\u0000',
  '\ud800',
  'a\udc00b',
  '\udbff\u0000\udfff',
  '\uE000',
  '\uE0000000',
  '\uE000escaped',
  '\\u0000',
  '\\\u0000\\',
  '"\u0000"',
  '😀 שלום \u202e مرحبا',
  '\u0001\u001f\u007f',
  '\ufffe\uffff',
  "'; DROP TABLE events; --",
  '$$\u0000$$',
];
const pick = (i: number) => `${hostile[i % hostile.length]}${hostile[(i * 7 + 3) % hostile.length]}#${i}`;

interface Sent {
  kind: 'settled' | 'unknown_model' | 'invalid';
  user: string;
  model?: string;
  email: string;
  status: number;
  requestId: string;
}

const adapters: { name: string; databaseUrl?: string }[] = [{ name: 'pglite' }];
if (process.env.DATABASE_URL) adapters.push({ name: 'postgres', databaseUrl: process.env.DATABASE_URL });
else console.log('postgres: skipped (set DATABASE_URL to run the fuzz against PostgreSQL too)');

for (const adapter of adapters) {
  const it = suite<{ gw: TestGateway; dbName?: string }>(`hostile strings reach the events intact (${adapter.name})`);

  it.before(async (context) => {
    let databaseUrl: string | undefined;
    if (adapter.databaseUrl) {
      context.dbName = `svc_hostile_${randomBytes(5).toString('hex')}`;
      const admin = new pg.Client({ connectionString: adapter.databaseUrl });
      await admin.connect();
      await admin.query(`CREATE DATABASE ${context.dbName}`);
      await admin.end();
      const url = new URL(adapter.databaseUrl);
      url.pathname = `/${context.dbName}`;
      databaseUrl = url.toString();
    }
    // ref-byte only: nothing here calls ref-gpt2, whose engine would start for nothing.
    const models = loadSettings().models.filter((m) => m.id === 'ref-byte');
    context.gw = await startTestGateway(databaseUrl ? { models, databaseUrl } : { models });
  });

  it.after(async (context) => {
    await context.gw?.stop();
    if (context.dbName) {
      const admin = new pg.Client({ connectionString: adapter.databaseUrl });
      await admin.connect();
      await admin.query(`DROP DATABASE IF EXISTS ${context.dbName} WITH (FORCE)`);
      await admin.end();
    }
  });

  it('1,000 bodies with hostile strings, interleaved with valid requests of other keys: no 5xx, every request recorded, every string byte for byte', async ({ gw }) => {
    const started = performance.now();
    // Keys whose e-mail and user id are hostile (the e-mail reaches every meter event of the key).
    const hostileKeys = await Promise.all(
      [0, 1, 2, 3].map(async (i) => {
        const email = `${hostile[(i * 5) % hostile.length].replace(/[\s@]/g, '')}${i}@ex\u0000ample\ud800.org`;
        const key = await issueKey(gw.url, gw.adminToken, { email, user_id: pick(100 + i) });
        return { key, email };
      }),
    );
    const plainKeys = await Promise.all([0, 1].map(async (i) => ({ key: await issueKey(gw.url, gw.adminToken, { email: `plain${i}@example.org` }), email: `plain${i}@example.org` })));

    const post = async (key: string, body: unknown) => {
      const res = await fetch(`${gw.url}/v1/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json', 'x-svc-workload': 'batch\u00e9', 'x-request-id': 'bad id \u00ff' },
        body: JSON.stringify(body),
      });
      await res.arrayBuffer();
      return { status: res.status, requestId: res.headers.get('x-request-id') ?? '' };
    };

    const sent: Sent[] = [];
    const valid: { status: number; requestId: string }[] = [];
    const work: (() => Promise<void>)[] = [];
    for (let i = 0; i < 1000; i++) {
      const { key, email } = hostileKeys[i % hostileKeys.length];
      const user = pick(i);
      const kind = (['settled', 'unknown_model', 'invalid', 'unknown_model', 'invalid'] as const)[i % 5];
      const model = kind === 'unknown_model' ? `model-${pick(i + 1)}` : undefined;
      const body =
        kind === 'settled' ? { prompt: 'hi', max_tokens: 1, temperature: 0, user }
        : kind === 'unknown_model' ? { model, prompt: 'hi', max_tokens: 1, user }
        : { prompt: 'hi', max_tokens: -5, user };
      work.push(async () => void sent.push({ kind, user, model, email, ...(await post(key, body)) }));
      // a valid request of another key after every fifth hostile one
      if (i % 5 === 4) work.push(async () => void valid.push(await post(plainKeys[i % 2].key, { prompt: 'hi', max_tokens: 1, temperature: 0, user: 'plain' })));
    }
    // 16 at a time (a key's active cap), drawn from one queue, so hostile and valid requests share batches
    let next = 0;
    await Promise.all(Array.from({ length: 16 }, async () => {
      while (next < work.length) await work[next++]();
    }));

    assert.is(sent.length, 1000);
    assert.equal(sent.filter((s) => s.status >= 500).map((s) => [s.kind, s.status]), [], 'no hostile request is answered 5xx');
    assert.equal(valid.filter((v) => v.status !== 200).map((v) => v.status), [], 'every valid request of the other keys succeeds');
    // the valid bodies are answered, the others refused (an unknown model, a negative max_tokens: 400)
    assert.equal(sent.filter((s) => s.status !== (s.kind === 'settled' ? 200 : 400)).map((s) => [s.kind, s.status]), []);

    // Every request is in the meter's events: settled or refused, under its request id.
    await gw.commands.settled();
    await gw.store.readable();
    const recorded = new Map<string, RecordedEvent>();
    for (let position = logStart; ; ) {
      const page = await gw.store.readAll(position, 1000);
      if (page.length === 0) break;
      for (const e of page) if (e.type === 'UsageSettled' || e.type === 'RequestRejected') recorded.set((e.data as { request_id: string }).request_id, e);
      position = page[page.length - 1].globalPosition;
    }
    const missing = [...sent, ...valid].filter((s) => !recorded.has(s.requestId));
    assert.is(missing.length, 0, `every request recorded (${missing.length} missing)`);
    for (const s of sent) {
      const event = recorded.get(s.requestId)!;
      const data = event.data as { user: string | null; model: string | null; email: string; workload: string | null };
      assert.is(event.type, s.kind === 'settled' ? 'UsageSettled' : 'RequestRejected');
      assert.ok(data.user === s.user, `user of ${s.requestId} byte for byte: ${JSON.stringify(data.user)} vs ${JSON.stringify(s.user)}`);
      assert.ok(data.email === s.email, `email of ${s.requestId} byte for byte`);
      if (s.model !== undefined) assert.ok(data.model === s.model, `refused model of ${s.requestId} byte for byte`);
      assert.is(data.workload, null);
    }
    // The keys' own events keep the hostile e-mail and user id too.
    const { rows } = await gw.store.query<{ n: string | number }>(`SELECT count(*) AS n FROM events WHERE event_type = 'KeyIssued'`);
    assert.ok(Number(rows[0].n) >= 6);
    const issued = (await gw.store.readAll(logStart, 100_000)).filter((e) => e.type === 'KeyIssued').map((e) => (e.data as { email: string }).email);
    for (const { email } of hostileKeys) assert.ok(issued.includes(email), 'the key\'s e-mail byte for byte');

    // The tables follow: a text column cannot hold U+0000 or a lone surrogate, so they hold the log's
    // escaped form of such strings (toStorableText), and no projection stops on them.
    await within(30_000, gw.projectionsCaughtUp(), 'the projections catching up with the hostile requests');
    assert.not.match(gw.logs(), /projection batch failed/, 'no projection batch failed');
    const ledger = await gw.store.query<{ request_id: string; user_tag: string | null; email: string }>('SELECT request_id, user_tag, email FROM usage_ledger');
    const byId = new Map(ledger.rows.map((r) => [r.request_id, r]));
    for (const s of sent) {
      const row = byId.get(s.requestId);
      assert.ok(row, `a ledger row for ${s.requestId}`);
      assert.is(row.user_tag, toStorableText(s.user));
      assert.is(row.email, toStorableText(s.email));
    }

    const seconds = (performance.now() - started) / 1000;
    console.log(`${adapter.name}: 1,000 hostile bodies and ${valid.length} valid requests in ${seconds.toFixed(1)} s`);
  });

  it.run();
}
