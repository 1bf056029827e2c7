import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { createRequire, syncBuiltinESMExports } from 'node:module';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { KeyService, parseKey } from '../../src/keys/index.ts';
import type { EventStore } from '../../src/store/index.ts';
import { adaptersUnderTest } from '../store/adapters.ts';

const require = createRequire(import.meta.url);

for (const adapter of adaptersUnderTest()) {
  const keys = suite(`key service (${adapter.name})`);
  let store: EventStore;
  let service: KeyService;

  keys.before(async () => {
    store = await adapter.open();
    service = new KeyService({ handler: new CommandHandler({ store }) });
    await service.start();
  });
  keys.after(async () => {
    await service.stop();
    await store.close();
    await adapter.cleanup();
  });

  keys('an issued key has the fixed format; only the hash of its secret is stored', async () => {
    const issued = await service.issue({ email: 'ada@example.org', budgets: { monthly_token_budget: 1000 } });
    const parsed = parseKey(issued.key);
    assert.ok(parsed, issued.key);
    assert.match(issued.key, /^svc_[0-9a-f]{12}_[A-Za-z0-9_-]{43}$/);
    assert.is(issued.view.prefix, parsed!.prefix);
    assert.is(issued.view.keyId, parsed!.prefix);
    assert.is(issued.view.userId, 'ada@example.org', 'user_id defaults to the e-mail');
    assert.equal(issued.view.budgets, { monthly_token_budget: 1000, daily_token_budget: null, monthly_input_token_budget: null, monthly_output_token_budget: null, monthly_harvest_jobs: null });
    const { events } = await store.readStream(`key-${parsed!.prefix}`);
    assert.is(events.length, 1);
    const stored = JSON.stringify(events);
    assert.not.ok(stored.includes(parsed!.secret), 'the secret is not in the event');
    assert.not.ok(stored.includes(issued.key));
    assert.match(stored, /"secret_sha256":"[0-9a-f]{64}"/);
  });

  keys('authenticate: good key ok; missing, malformed, unknown, wrong, paused and revoked are 401 invalid_api_key', async () => {
    const { key, view } = await service.issue({ email: 'bob@example.org', userId: 'bob' });
    const good = await service.authenticate(`Bearer ${key}`);
    assert.ok(good.ok);
    assert.is(good.ok && good.key.userId, 'bob');
    assert.ok((await service.authenticate(`bearer ${key}`)).ok, 'the scheme is case-insensitive');

    const { secret } = parseKey(key)!;
    const wrongSecret = `svc_${view.prefix}_${secret.slice(0, -1)}${secret.endsWith('A') ? 'B' : 'A'}`;
    const cases: [string, string | undefined, RegExp, string | undefined][] = [
      ['missing', undefined, /missing/, undefined],
      ['empty', '', /missing/, undefined],
      ['not bearer', `Basic ${Buffer.from('a:b').toString('base64')}`, /malformed/, undefined],
      ['malformed', 'Bearer sk-not-ours', /malformed/, undefined],
      ['bare key', key, /malformed/, undefined],
      ['unknown prefix', `Bearer svc_000000000000_${secret}`, /invalid API key/, undefined],
      ['wrong secret', `Bearer ${wrongSecret}`, /invalid API key/, view.prefix],
    ];
    for (const [name, header, message, prefix] of cases) {
      const result = await service.authenticate(header);
      assert.not.ok(result.ok, name);
      if (result.ok) continue;
      assert.is(result.error.code, 'invalid_api_key', name);
      assert.is(result.error.status, 401, name);
      assert.match(result.error.message, message, name);
      assert.not.ok(result.error.message.includes(secret), `${name}: the message never repeats the secret`);
      assert.is(result.prefix, prefix, name);
    }

    await service.pause(view.prefix);
    const paused = await service.authenticate(`Bearer ${key}`);
    assert.ok(!paused.ok && paused.error.status === 401 && /paused/.test(paused.error.message));
    await service.resume(view.prefix);
    assert.ok((await service.authenticate(`Bearer ${key}`)).ok, 'resumed');
    await service.revoke(view.prefix);
    const revoked = await service.authenticate(`Bearer ${key}`);
    assert.ok(!revoked.ok && /revoked/.test(revoked.error.message));
    for (const action of ['resume', 'pause'] as const) {
      try {
        await service[action](view.prefix);
        assert.unreachable(`${action} after revoke`);
      } catch (err) {
        assert.is((err as { code: string }).code, 'key_revoked', action);
      }
    }
    assert.is((await service.revoke(view.prefix)).status, 'revoked', 'revoking again changes nothing');
    assert.not.ok((await service.authenticate(`Bearer ${key}`)).ok, 'revocation is forever');
  });

  keys('the secret is compared with crypto.timingSafeEqual', async () => {
    const { key } = await service.issue({ email: 'eve@example.org' });
    const crypto = require('node:crypto') as typeof import('node:crypto');
    const original = crypto.timingSafeEqual;
    const calls: number[][] = [];
    crypto.timingSafeEqual = ((a: NodeJS.ArrayBufferView, b: NodeJS.ArrayBufferView) => {
      calls.push([a.byteLength, b.byteLength]);
      return original(a, b);
    }) as typeof original;
    syncBuiltinESMExports();
    try {
      assert.ok((await service.authenticate(`Bearer ${key}`)).ok);
      const last = key.slice(-1) === 'x' ? 'y' : 'x';
      assert.not.ok((await service.authenticate(`Bearer ${key.slice(0, -1)}${last}`)).ok);
    } finally {
      crypto.timingSafeEqual = original;
      syncBuiltinESMExports();
    }
    assert.equal(calls, [[32, 32], [32, 32]], 'both the right and the wrong secret went through timingSafeEqual on 32-byte hashes');
  });

  keys('budgets change; unknown prefixes are 404 not_found; current() serves the cached state', async () => {
    const { view } = await service.issue({ email: 'carol@example.org', budgets: { daily_token_budget: 5 } });
    const changed = await service.changeBudgets(view.prefix, { daily_token_budget: null, monthly_output_token_budget: 70 });
    assert.is(changed.budgets.daily_token_budget, null);
    assert.is(changed.budgets.monthly_output_token_budget, 70);
    assert.equal((await service.current(view.prefix))?.budgets, changed.budgets);
    assert.equal((await service.get(view.prefix))?.budgets, changed.budgets);
    assert.is(await service.current('0123456789ab'), null);
    assert.is(await service.current('not a prefix'), null);
    for (const action of [() => service.pause('0123456789ab'), () => service.changeBudgets('0123456789ab', { daily_token_budget: 1 }), () => service.revoke('nope')]) {
      try {
        await action();
        assert.unreachable();
      } catch (err) {
        assert.is((err as { code: string }).code, 'not_found');
      }
    }
  });

  keys('another process pauses and revokes a key: this process sees it once its subscription catches up', async () => {
    // A second "process": its own store connection (pool), command handler and key service.
    const otherStore = adapter.name === 'postgres' ? await adapter.open() : store;
    const other = new KeyService({ handler: new CommandHandler({ store: otherStore }) });
    await other.start();
    try {
      const { key, view } = await service.issue({ email: 'dan@example.org' });
      assert.ok((await service.authenticate(`Bearer ${key}`)).ok, 'cached here');
      await other.caughtUp();
      assert.ok((await other.authenticate(`Bearer ${key}`)).ok, 'issued in the first process, known in the second');

      await other.pause(view.prefix);
      await store.readable();
      await service.caughtUp();
      const paused = await service.authenticate(`Bearer ${key}`);
      assert.ok(!paused.ok && /paused/.test(paused.error.message), 'the pause reached the first process');
      assert.is((await service.current(view.prefix))?.status, 'paused');

      await service.resume(view.prefix);
      await store.readable();
      await other.caughtUp();
      assert.ok((await other.authenticate(`Bearer ${key}`)).ok, 'the resume reached the second process');

      await other.revoke(view.prefix);
      await store.readable();
      await service.caughtUp();
      assert.not.ok((await service.authenticate(`Bearer ${key}`)).ok, 'the revocation reached the first process');
    } finally {
      await other.stop();
      if (otherStore !== store) await otherStore.close();
    }
  });

  keys.run();
}
