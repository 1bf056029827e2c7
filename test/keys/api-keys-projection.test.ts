import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { KeyBudgetsChanged, KeyIssued, KeyPaused, KeyResumed, KeyRevoked } from '../../events/key.ts';
import { apiKeys } from '../../projections/api-keys.ts';
import { projections } from '../../projections/index.ts';
import type { EventStore } from '../../src/store/index.ts';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { KeyService } from '../../src/keys/index.ts';
import { ProjectionRunner } from '../../src/processors/index.ts';
import { applyTwice, recorded } from '../support/projection-specification.ts';
import { adaptersUnderTest } from '../store/adapters.ts';

const budgets = { monthly_token_budget: 1000, daily_token_budget: null, monthly_input_token_budget: null, monthly_output_token_budget: 400, monthly_harvest_jobs: 3 };
const hash = 'ab'.repeat(32);

for (const adapter of adaptersUnderTest()) {
  const projection = suite(`api_keys projection (${adapter.name})`);
  let store: EventStore;
  projection.before(async () => {
    store = await adapter.open();
  });
  projection.after(async () => {
    await store.close();
    await adapter.cleanup();
  });

  projection('registered; one row per key with its status and budgets; idempotent; never the hash', async () => {
    assert.ok(projections.includes(apiKeys));
    const k1 = (v: number, e: Parameters<typeof recorded>[0]) => recorded(e, { streamId: 'key-aaaaaaaaaaaa', streamVersion: v });
    const k2 = (v: number, e: Parameters<typeof recorded>[0]) => recorded(e, { streamId: 'key-bbbbbbbbbbbb', streamVersion: v });
    const events = [
      k1(1, KeyIssued({ key_id: 'aaaaaaaaaaaa', secret_sha256: hash, email: 'ada@example.org', user_id: 'ada', budgets, at: '2026-11-01T10:00:00.000Z' })),
      k2(1, KeyIssued({ key_id: 'bbbbbbbbbbbb', secret_sha256: hash, email: 'bob@example.org', user_id: 'bob@example.org', budgets, at: '2026-11-02T10:00:00.000Z' })),
      k1(2, KeyPaused({ key_id: 'aaaaaaaaaaaa', at: '2026-11-03T10:00:00.000Z' })),
      k1(3, KeyResumed({ key_id: 'aaaaaaaaaaaa', at: '2026-11-04T10:00:00.000Z' })),
      k1(4, KeyBudgetsChanged({ key_id: 'aaaaaaaaaaaa', budgets: { monthly_token_budget: null, daily_token_budget: 50 }, at: '2026-11-05T10:00:00.000Z' })),
      k2(2, KeyPaused({ key_id: 'bbbbbbbbbbbb', at: '2026-11-06T10:00:00.000Z' })),
      k2(3, KeyRevoked({ key_id: 'bbbbbbbbbbbb', at: '2026-11-07T10:00:00.000Z' })),
    ];
    const rows = await applyTwice(store, apiKeys, events, 'SELECT * FROM api_keys ORDER BY key_id');
    assert.equal(rows, [
      {
        key_id: 'aaaaaaaaaaaa', prefix: 'aaaaaaaaaaaa', email: 'ada@example.org', user_id: 'ada', status: 'active',
        monthly_token_budget: null, daily_token_budget: rows[0].daily_token_budget, monthly_input_token_budget: null, monthly_output_token_budget: rows[0].monthly_output_token_budget, monthly_harvest_jobs: rows[0].monthly_harvest_jobs,
        issued_at: rows[0].issued_at, updated_at: rows[0].updated_at,
      },
      {
        key_id: 'bbbbbbbbbbbb', prefix: 'bbbbbbbbbbbb', email: 'bob@example.org', user_id: 'bob@example.org', status: 'revoked',
        monthly_token_budget: rows[1].monthly_token_budget, daily_token_budget: null, monthly_input_token_budget: null, monthly_output_token_budget: rows[1].monthly_output_token_budget, monthly_harvest_jobs: rows[1].monthly_harvest_jobs,
        issued_at: rows[1].issued_at, updated_at: rows[1].updated_at,
      },
    ]);
    // bigint comes back as text from pg and as a number from PGlite: compare the values.
    assert.equal([rows[0].daily_token_budget, rows[0].monthly_output_token_budget, rows[0].monthly_harvest_jobs].map(Number), [50, 400, 3]);
    assert.equal([rows[1].monthly_token_budget].map(Number), [1000]);
    assert.is(new Date(rows[0].issued_at as string).toISOString(), '2026-11-01T10:00:00.000Z');
    assert.is(new Date(rows[0].updated_at as string).toISOString(), '2026-11-05T10:00:00.000Z');
    assert.is(new Date(rows[1].updated_at as string).toISOString(), '2026-11-07T10:00:00.000Z');
    assert.not.ok(JSON.stringify(rows).includes(hash), 'the secret hash is not projected');
  });

  projection('a pause replayed after the revocation does not undo it', async () => {
    const at = (d: number) => `2026-11-0${d}T00:00:00.000Z`;
    const k = (v: number, e: Parameters<typeof recorded>[0]) => recorded(e, { streamId: 'key-cccccccccccc', streamVersion: v });
    await store.transaction((tx) => apiKeys.apply([k(1, KeyIssued({ key_id: 'cccccccccccc', secret_sha256: hash, email: 'c@example.org', user_id: 'c', budgets, at: at(1) })), k(2, KeyRevoked({ key_id: 'cccccccccccc', at: at(2) }))], tx));
    await store.transaction((tx) => apiKeys.apply([k(3, KeyPaused({ key_id: 'cccccccccccc', at: at(3) }))], tx));
    const { rows } = await store.query<{ status: string }>(`SELECT status FROM api_keys WHERE key_id = 'cccccccccccc'`);
    assert.is(rows[0].status, 'revoked');
  });

  projection('live from real key commands, and a rebuild reproduces the table row for row', async () => {
    const keys = new KeyService({ handler: new CommandHandler({ store }) });
    const runner = new ProjectionRunner({ store, projections: [apiKeys] });
    await runner.start();
    try {
      const a = await keys.issue({ email: 'live@example.org', budgets: { monthly_token_budget: 10 } });
      const b = await keys.issue({ email: 'live@example.org', userId: 'team' });
      await keys.pause(a.view.prefix);
      await keys.changeBudgets(a.view.prefix, { monthly_token_budget: null, daily_token_budget: 7 });
      await keys.revoke(b.view.prefix);
      await runner.caughtUp();
      const read = async () => (await store.query(`SELECT * FROM api_keys WHERE email = 'live@example.org' ORDER BY key_id`)).rows.map((r) => JSON.parse(JSON.stringify(r)));
      const live = await read();
      assert.is(live.length, 2);
      const byId = Object.fromEntries(live.map((r) => [r.key_id, r]));
      assert.is(byId[a.view.prefix].status, 'paused');
      assert.is(byId[a.view.prefix].monthly_token_budget, null);
      assert.is(Number(byId[a.view.prefix].daily_token_budget), 7);
      assert.is(byId[b.view.prefix].status, 'revoked');
      assert.is(byId[b.view.prefix].user_id, 'team');
      await runner.rebuild('api_keys');
      assert.equal(await read(), live);
    } finally {
      await runner.stop();
    }
  });

  projection.run();
}
