/**
 * The service with EventStoreDB/KurrentDB as its event log (SVC_EVENT_LOG=eventstoredb, issue 30): the
 * settings, and a start against a server that is not there (one line naming EVENTSTORE_URL, nothing
 * left open), always; a whole gateway on a real server (a key created, a completion metered, the
 * projections caught up in the SQL store and read back) only when EVENTSTORE_URL is set, reported
 * skipped otherwise. No server is faked.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn } from 'node:child_process';
import net from 'node:net';
import { rmSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { ConfigError, loadSettings } from '../../src/config/index.ts';
import { EventLogUnreachable, redactedEventStoreUrl, startGateway } from '../../src/gateway/index.ts';
import { comparePositions, internalTable, openEventStore, openEventStoreDbLog, type RecordedEvent } from '../../src/store/index.ts';
import { sqlCheckpoints } from '../../src/processors/index.ts';
import { checkpointOf } from '../../src/processors/index.ts';
import { runEventsCommand } from '../../src/cli/events.ts';
import { projections } from '../../projections/index.ts';
import { workflows } from '../../workflows/index.ts';
import { freshDataDir, issueKey, json } from '../support/gateway.ts';
import { within } from '../support/within.ts';

const svc = fileURLToPath(new URL('../../bin/svc.js', import.meta.url));
const url = process.env.EVENTSTORE_URL;

/** A port nobody listens on (taken, then let go). */
function closedPort(): Promise<number> {
  return new Promise((resolve) => {
    const probe = net.createServer().listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as net.AddressInfo;
      probe.close(() => resolve(port));
    });
  });
}

function run(args: string[], env: NodeJS.ProcessEnv): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [svc, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk) => (stdout += chunk));
    child.stderr.on('data', (chunk) => (stderr += chunk));
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

const config = suite('SVC_EVENT_LOG and EVENTSTORE_URL');

config('the log is the SQL store by default, and EVENTSTORE_URL is read only with eventstoredb', () => {
  const plain = loadSettings({});
  assert.is(plain.eventLog, 'sql');
  assert.is(plain.eventStoreUrl, null);
  const sql = loadSettings({ SVC_EVENT_LOG: 'sql', EVENTSTORE_URL: 'not a url at all' });
  assert.is(sql.eventLog, 'sql');
  assert.is(sql.eventStoreUrl, null, 'ignored unless the log is EventStoreDB');
  const esdb = loadSettings({ SVC_EVENT_LOG: 'eventstoredb', EVENTSTORE_URL: 'esdb://127.0.0.1:2113?tls=false' });
  assert.is(esdb.eventLog, 'eventstoredb');
  assert.is(esdb.eventStoreUrl, 'esdb://127.0.0.1:2113?tls=false');
  assert.is(loadSettings({ SVC_EVENT_LOG: 'eventstoredb', EVENTSTORE_URL: 'esdb+discover://a:2113,b:2113' }).eventStoreUrl, 'esdb+discover://a:2113,b:2113');
});

config('a wrong SVC_EVENT_LOG, a missing or malformed EVENTSTORE_URL are ConfigErrors naming the variable (never echoing a password)', () => {
  const refused = (env: NodeJS.ProcessEnv, message: RegExp) => {
    try {
      loadSettings(env);
      assert.unreachable(`accepted ${JSON.stringify(env)}`);
    } catch (error) {
      assert.instance(error, ConfigError);
      assert.match((error as Error).message, message);
      assert.not.match((error as Error).message, /s3cret/);
    }
  };
  refused({ SVC_EVENT_LOG: 'kafka' }, /SVC_EVENT_LOG: "kafka" is not sql or eventstoredb/);
  refused({ SVC_EVENT_LOG: 'eventstoredb' }, /SVC_EVENT_LOG=eventstoredb needs EVENTSTORE_URL/);
  refused({ SVC_EVENT_LOG: 'eventstoredb', EVENTSTORE_URL: '' }, /needs EVENTSTORE_URL/);
  refused({ SVC_EVENT_LOG: 'eventstoredb', EVENTSTORE_URL: 'postgres://admin:s3cret@127.0.0.1:5432/x' }, /EVENTSTORE_URL: not an esdb:\/\/ or esdb\+discover:\/\//);
});

config('a connection string is shown without its password', () => {
  assert.is(redactedEventStoreUrl('esdb://admin:s3cret@127.0.0.1:2113?tls=false'), 'esdb://admin:***@127.0.0.1:2113?tls=false');
  assert.is(redactedEventStoreUrl('esdb://127.0.0.1:2113?tls=false'), 'esdb://127.0.0.1:2113?tls=false');
});

config.run();

const unreachable = suite('EventStoreDB not there');

unreachable('svc serve exits 1 with one line naming EVENTSTORE_URL (no stack trace, no password) and leaves the data directory free', async () => {
  const dataDir = await freshDataDir();
  try {
    const port = await closedPort();
    const env = { ...process.env, SVC_EVENT_LOG: 'eventstoredb', EVENTSTORE_URL: `esdb://admin:s3cret@127.0.0.1:${port}?tls=false`, DATABASE_URL: '', DATA_DIR: dataDir, PORT: '0', SVC_ENGINE_WARM_AT_START: 'off', SVC_ADMIN_TOKEN: 'svc_admin_test_eventstoredb' };
    const started = performance.now();
    const served = await run(['serve'], env);
    assert.is(served.code, 1, served.stderr);
    const lines = served.stderr.trim().split('\n');
    assert.is(lines.length, 1, served.stderr);
    assert.match(lines[0], new RegExp(`^svc: the event log \\(SVC_EVENT_LOG=eventstoredb\\) cannot be opened at EVENTSTORE_URL esdb://admin:\\*\\*\\*@127\\.0\\.0\\.1:${port}\\?tls=false: .+; start the server, or correct EVENTSTORE_URL$`));
    assert.not.match(served.stderr, /s3cret|\n\s+at /);
    assert.ok(performance.now() - started < 120_000, `gave up instead of retrying on; took ${Math.round(performance.now() - started)} ms`);
    // The same for the CLI's readers of the log.
    const read = await run(['events', 'read', 'key-0123456789ab'], env);
    assert.is(read.code, 1, read.stderr);
    assert.match(read.stderr.trim(), /^svc: the event log \(SVC_EVENT_LOG=eventstoredb\) cannot be opened at EVENTSTORE_URL [^\n]+$/);
    assert.not.match(read.stderr, /s3cret/);
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
});

unreachable('startGateway rejects with EventLogUnreachable after closing what it opened: the SQL store can be opened again at once', async () => {
  const dataDir = await freshDataDir();
  try {
    const port = await closedPort();
    const settings = loadSettings({ ...process.env, SVC_EVENT_LOG: 'eventstoredb', EVENTSTORE_URL: `esdb://127.0.0.1:${port}?tls=false`, DATABASE_URL: '', DATA_DIR: dataDir, PORT: '0', SVC_ENGINE_WARM_AT_START: 'off' });
    const error = await within(30_000, startGateway(settings, { adminToken: 'svc_admin_test_eventstoredb', logDestination: { write: () => {} } as never }), 'starting against a closed port').then(
      async (gateway) => {
        await gateway.close();
        assert.unreachable('started');
      },
      (e: unknown) => e,
    );
    assert.instance(error, EventLogUnreachable);
    assert.match((error as Error).message, /EVENTSTORE_URL/);
    // The store it opened beside the log was closed: its data directory's lock is free.
    const store = await openEventStore({ dataDir });
    await store.close();
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
});

unreachable.run();

if (!url) {
  const reason = 'skipped: EVENTSTORE_URL is not set (e.g. esdb://127.0.0.1:2113?tls=false); no EventStoreDB server, and none is faked';
  console.log(`eventstoredb-log: the gateway on EventStoreDB is ${reason}`);
  const skipped = suite('gateway with EventStoreDB as its log');
  skipped.skip(`a key created, a completion metered, the projections caught up in the SQL store and read back, the log read from EventStoreDB: ${reason}`, () => {});
  skipped.run();
} else {
  const it = suite('gateway with EventStoreDB as its log');

  it('a key created, a completion metered, the projections caught up in the SQL store and read back; the SQL log stays empty', async () => {
    // The server is shared with other runs and tests (the log contract's events, some of a domain
    // type with test data): this gateway's projections and workflows start at its end, as a
    // deployment's would on a log that was there before it.
    const dataDir = await freshDataDir();
    const esdb = await openEventStoreDbLog({ url });
    const db = await openEventStore({ dataDir });
    try {
      const end = await esdb.head();
      const names = [...projections.map((p) => p.name), ...workflows.map(checkpointOf)];
      await db.transaction(async (tx) => {
        for (const name of names) await sqlCheckpoints(db).set(tx, name, end);
      });
    } finally {
      await db.close();
      await esdb.close();
    }
    const settings = loadSettings({ SVC_ENGINE_WARM_AT_START: 'on', ...process.env, DATA_DIR: dataDir, PORT: '0', HOST: '127.0.0.1', DATABASE_URL: '', SVC_EVENT_LOG: 'eventstoredb', EVENTSTORE_URL: url });
    const adminToken = 'svc_admin_test_eventstoredb';
    const gateway = await startGateway(settings, { adminToken, logDestination: { write: () => {} } as never });
    const gw = { ...gateway, adminHeaders: (extra: Record<string, string> = {}) => ({ authorization: `Bearer ${adminToken}`, ...extra }) };
    try {
      assert.ok(gw.log !== (gw.store as unknown), 'the log is not the SQL store');
      await issueKey(gw.url, adminToken); // the admin API works before anything else
      const headBefore = await gw.log.head();
      const created = await json(
        await fetch(`${gw.url}/admin/keys`, { method: 'POST', headers: gw.adminHeaders({ 'content-type': 'application/json' }), body: JSON.stringify({ email: 'esdb@example.org', monthly_token_budget: 100_000 }) }),
      );
      const res = await fetch(`${gw.url}/v1/completions`, {
        method: 'POST',
        headers: { authorization: `Bearer ${created.key}`, 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: 'hello', max_tokens: 3, temperature: 0 }),
      });
      const body = await json(res);
      assert.is(res.status, 200, JSON.stringify(body));
      const { prompt_tokens: input, completion_tokens: output } = body.usage;

      // The log: the key's stream and today's meter stream, read from EventStoreDB.
      const keyStream = await gw.log.readStream(`key-${created.prefix}`);
      assert.is(keyStream.events[0]?.type, 'KeyIssued');
      const day = new Date().toISOString().slice(0, 10);
      await within(10_000, (async () => {
        for (;;) {
          const meter = await gw.log.readStream(`meter-${created.prefix}-${day}`);
          if (meter.events.some((e: RecordedEvent) => e.type === 'UsageSettled')) return;
          await new Promise((r) => setTimeout(r, 50));
        }
      })(), 'the settlement in the log');
      assert.ok(comparePositions(await gw.log.head(), headBefore) > 0, 'the log moved');

      // The projections, in the SQL store, caught up with the ESDB log.
      await within(20_000, gw.projectionsCaughtUp(), 'projections caught up');
      const shown = await json(await fetch(`${gw.url}/admin/keys/${created.prefix}`, { headers: gw.adminHeaders() }));
      assert.is(shown.usage.requests, 1, JSON.stringify(shown.usage));
      assert.is(shown.usage.input_tokens, input);
      assert.is(shown.usage.output_tokens, output);
      const { rows } = await gw.store.query<{ name: string; transaction_id: string; global_position: string }>(
        `SELECT name, transaction_id::text, global_position::text FROM ${internalTable(gw.store, 'projection_checkpoints')} WHERE name = 'key_usage'`,
      );
      const checkpoint = { transactionId: Number(rows[0].transaction_id), position: Number(rows[0].global_position) };
      assert.ok(comparePositions(checkpoint, await gw.log.head()) <= 0 && checkpoint.transactionId > 0, 'the checkpoint is a place in the ESDB log');

      // Nothing went to the SQL store's own log.
      assert.equal(await gw.store.readAll(gw.store.start, 10), []);

      // The CLI reads the same log: svc events read, through the configured log.
      const out: string[] = [];
      assert.is(await runEventsCommand(['read', `key-${created.prefix}`, '--json'], { store: gw.log, stdout: { write: (t: string) => out.push(t) }, stderr: { write: () => {} } }), 0);
      assert.is(JSON.parse(out.join('').split('\n')[0]).type, 'KeyIssued');

      const health = await fetch(`${gw.url}/health`);
      assert.is(health.status, 200);
      assert.ok(((await health.json()) as { wrapper: { database: { ok: boolean } } }).wrapper.database.ok);
    } finally {
      await gateway.close();
      rmSync(dataDir, { recursive: true, force: true });
    }
  });

  it.run();
}
