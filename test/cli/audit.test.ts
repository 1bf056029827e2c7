/** `svc audit usage`: the log and key_usage agree after a mixed workload; a corrupted row is found and printed. */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import type { EventStore } from '../../src/store/index.ts';
import { ProjectionRunner } from '../../src/processors/index.ts';
import { runAuditCommand } from '../../src/cli/audit.ts';
import { projections } from '../../projections/index.ts';
import { adaptersUnderTest } from '../store/adapters.ts';
import { mixedWorkload, type Workload } from '../support/meter-workload.ts';

function collect() {
  return {
    text: '',
    write(text: string) {
      this.text += text;
    },
  };
}

async function audit(store: EventStore, ...args: string[]): Promise<{ code: number; out: string; err: string }> {
  const stdout = collect();
  const stderr = collect();
  const code = await runAuditCommand(args, { store, stdout, stderr });
  return { code, out: stdout.text, err: stderr.text };
}

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore; runner: ProjectionRunner; workload: Workload }>(`svc audit usage (${adapter.name})`);
  it.before(async (context) => {
    context.store = await adapter.open({ pollIntervalMs: 100 });
    context.runner = new ProjectionRunner({ store: context.store, projections, pollIntervalMs: 50 });
    await context.runner.start();
    context.workload = await mixedWorkload(context.store);
    await context.runner.caughtUp();
  });
  it.after(async (context) => {
    await context.runner?.stop();
    await context.store?.close();
    await adapter.cleanup();
  });

  it('agrees with key_usage after a mixed workload (month turn, carried hold, expiry, rejection, open hold): exit 0', async ({ store, workload }) => {
    for (const [key, month] of [
      [workload.a.keyId, '2026-11'],
      [workload.a.keyId, '2026-12'],
      [workload.b.keyId, '2026-11'],
    ]) {
      const { code, out } = await audit(store, 'usage', '--key', key, '--month', month);
      assert.is(code, 0, out);
      assert.match(out, /agree: \d+ period\(s\)/);
    }
    const { code, out } = await audit(store, 'usage', '--key', workload.a.keyId, '--month', '2026-11');
    assert.is(code, 0);
    // Both sides printed: the month row and each day, log over projection.
    assert.match(out, /2026-11\s+log\s+0\s+25\s+43\s+3\s+1\s+1\n\s+projection\s+0\s+25\s+43\s+3\s+1\s+1/);
    assert.match(out, /2026-11-29\s+log/);
    assert.match(out, /2026-11-30\s+log/);
    const json = JSON.parse((await audit(store, 'usage', '--key', workload.a.keyId, '--month', '2026-12', '--json')).out);
    assert.is(json.agree, true);
    assert.equal(
      json.periods.map((p: { period: string; log: { reserved_tokens: number }; differs: string[] }) => [p.period, p.log.reserved_tokens, p.differs]),
      [
        ['2026-12', 20, []],
        ['2026-12-01', 20, []],
      ],
    );
  });

  it('a month with no usage agrees (nothing on either side)', async ({ store, workload }) => {
    const { code, out } = await audit(store, 'usage', '--key', workload.a.keyId, '--month', '2026-10');
    assert.is(code, 0);
    assert.match(out, 'no usage in this month');
  });

  it('a corrupted key_usage row, or a missing one: exit 1 and the difference printed', async ({ store, workload }) => {
    const key = workload.a.keyId;
    await store.query(`UPDATE key_usage SET output_tokens = output_tokens + 1 WHERE key_id = $1 AND period_kind = 'day' AND period = '2026-11-30'`, [key]);
    let result = await audit(store, 'usage', '--key', key, '--month', '2026-11');
    assert.is(result.code, 1, result.out);
    assert.match(result.out, /2026-11-30\s+log\s+0\s+10\s+18\s+2\s+0\s+0\n\s+projection\s+0\s+10\s+19\s+2\s+0\s+0\s+<- output_tokens/);
    assert.match(result.out, 'DIFFER: 1 of 3 period(s): 2026-11-30');
    await store.query(`UPDATE key_usage SET output_tokens = output_tokens - 1 WHERE key_id = $1 AND period_kind = 'day' AND period = '2026-11-30'`, [key]);
    assert.is((await audit(store, 'usage', '--key', key, '--month', '2026-11')).code, 0, 'repaired');

    await store.query(`DELETE FROM key_usage WHERE key_id = $1 AND period_kind = 'day' AND period = '2026-11-29'`, [key]);
    result = await audit(store, 'usage', '--key', key, '--month', '2026-11', '--json');
    assert.is(result.code, 1);
    const json = JSON.parse(result.out);
    assert.is(json.agree, false);
    assert.equal(json.periods.filter((p: { differs: string[] }) => p.differs.length > 0).map((p: { period: string; projection: unknown }) => [p.period, p.projection]), [['2026-11-29', null]]);
    // put it back by replaying: the rebuild restores the row
    await new ProjectionRunner({ store, projections }).rebuild('key_usage');
    assert.is((await audit(store, 'usage', '--key', key, '--month', '2026-11')).code, 0, 'rebuilt');
  });

  it('a projection behind the log is compared at its checkpoint, not reported wrong', async ({ store, runner, workload }) => {
    await runner.stop();
    const { a } = workload;
    await a.reserve('2026-12-01', `${a.keyId}-late`, 1, 1, '2026-12-01T00:05:00.000Z');
    await store.readable();
    const { code, out } = await audit(store, 'usage', '--key', a.keyId, '--month', '2026-12');
    assert.is(code, 0, out);
    assert.match(out, /the projection is 1 event\(s\) behind the log/);
  });

  it('bad arguments: exit 2 with the usage; a full key is refused', async ({ store }) => {
    assert.is((await audit(store, 'usage', '--month', '2026-11')).code, 2);
    assert.is((await audit(store, 'usage', '--key', 'abc', '--month', '2026-13')).code, 2);
    const full = await audit(store, 'usage', '--key', 'svc_0123456789ab_secret', '--month', '2026-11');
    assert.is(full.code, 2);
    assert.not.match(full.err, 'secret');
    assert.match((await audit(store, 'spend')).err, 'usage: svc audit usage');
  });

  it.run();
}
