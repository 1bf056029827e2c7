/** `svc events read` and `svc events tail`: a stream and the live global log as an auditor reads them. */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import type { EventStore } from '../../src/store/index.ts';
import { runEventsCommand } from '../../src/cli/events.ts';
import { meterStream } from '../../events/meter.ts';
import { adaptersUnderTest } from '../store/adapters.ts';
import { MeterDriver, newKeyId } from '../support/meter-workload.ts';

/** An output that resolves `until(n)` once n lines were written. */
function lines() {
  const out = {
    text: '',
    waiters: [] as { n: number; resolve(): void }[],
    write(text: string) {
      out.text += text;
      const count = out.text.split('\n').length - 1;
      out.waiters = out.waiters.filter((w) => (count >= w.n ? (w.resolve(), false) : true));
    },
    until(n: number): Promise<void> {
      return new Promise((resolve) => {
        out.waiters.push({ n, resolve });
        out.write('');
      });
    },
  };
  return out;
}

for (const adapter of adaptersUnderTest()) {
  const it = suite<{ store: EventStore }>(`svc events (${adapter.name})`);
  it.before(async (context) => {
    context.store = await adapter.open({ pollIntervalMs: 100 });
  });
  it.after(async (context) => {
    await context.store?.close();
    await adapter.cleanup();
  });

  it('read STREAM: every event with version, type, time, data and metadata; --json one object per line', async ({ store }) => {
    const key = new MeterDriver(store, newKeyId());
    const day = '2026-11-24';
    await key.open(day, `${day}T10:00:00.000Z`);
    await key.reserve(day, 'req-1', 5, 7, `${day}T10:00:01.000Z`);
    await key.settle(day, 'req-1', 5, 3, `${day}T10:00:02.000Z`);
    const stream = meterStream(key.keyId, day);

    const text = lines();
    assert.is(await runEventsCommand(['read', stream], { store, stdout: text, stderr: lines() }), 0);
    assert.match(text.text, `${stream}: version 3`);
    assert.match(text.text, /#1  \d+\/\d+  \d{4}-\d{2}-\d{2}T[\d:.]+Z  MeterOpened\n    data      \{.*"key_id":"[0-9a-f]{12}"/);
    assert.match(text.text, /#2 .* BudgetReserved\n    data      \{.*"request_id":"req-1".*\n    metadata  \{.*"command_id":/);
    assert.match(text.text, /#3 .* UsageSettled\n/);

    const json = lines();
    assert.is(await runEventsCommand(['read', stream, '--json'], { store, stdout: json, stderr: lines() }), 0);
    const events = json.text.trim().split('\n').map((l) => JSON.parse(l));
    assert.equal(events.map((e) => [e.stream_id, e.version, e.type]), [
      [stream, 1, 'MeterOpened'],
      [stream, 2, 'BudgetReserved'],
      [stream, 3, 'UsageSettled'],
    ]);
    assert.equal(events[2].data.output_tokens, 3);
    assert.is(events[1].metadata.schema_version, 3); // BudgetReserved is at version 3 (it records its budgets and limits)
    assert.ok(!Number.isNaN(Date.parse(events[0].recorded_at)));
    assert.match(events[0].global_position, /^\d+\/\d+$/);
  });

  it('read of a stream with no events: exit 1 and says so; bad arguments: exit 2', async ({ store }) => {
    const err = lines();
    assert.is(await runEventsCommand(['read', 'meter-000000000000-1999-01-01'], { store, stdout: lines(), stderr: err }), 1);
    assert.match(err.text, 'has no events');
    assert.is(await runEventsCommand(['read'], { store, stdout: lines(), stderr: lines() }), 2);
    assert.is(await runEventsCommand(['tail', '--from', 'yesterday'], { store, stdout: lines(), stderr: lines() }), 2);
    assert.is(await runEventsCommand(['follow'], { store, stdout: lines(), stderr: lines() }), 2);
  });

  it('tail: follows the global log live from the head, until stopped', async ({ store }) => {
    const before = new MeterDriver(store, newKeyId());
    await before.open('2026-11-24', '2026-11-24T09:00:00.000Z'); // before the tail starts: not shown
    await store.readable(); // so the head the tail starts from is past it
    const out = lines();
    const stop = new AbortController();
    let following!: () => void;
    const started = new Promise<void>((resolve) => (following = resolve));
    const done = runEventsCommand(['tail', '--json'], { store, stdout: out, stderr: lines(), signal: stop.signal, onFollowing: () => following() });
    await started;
    const key = new MeterDriver(store, newKeyId());
    await key.issue('2026-11-24T10:00:00.000Z');
    await key.open('2026-11-24', '2026-11-24T10:00:00.000Z');
    await key.reserve('2026-11-24', 'req-t', 1, 2, '2026-11-24T10:00:01.000Z');
    await out.until(3);
    stop.abort();
    assert.is(await done, 0);
    const events = out.text.trim().split('\n').map((l) => JSON.parse(l));
    assert.equal(events.map((e) => [e.stream_id, e.type]), [
      [`key-${key.keyId}`, 'KeyIssued'],
      [meterStream(key.keyId, '2026-11-24'), 'MeterOpened'],
      [meterStream(key.keyId, '2026-11-24'), 'BudgetReserved'],
    ]);
  });

  it('tail --from start: the whole log first, in global order, readable text with stream and version', async ({ store }) => {
    const out = lines();
    const stop = new AbortController();
    const total = await store.countAfter({ transactionId: 0, position: 0 });
    const done = runEventsCommand(['tail', '--from', 'start'], { store, stdout: out, stderr: lines(), signal: stop.signal });
    await out.until(total * 3); // three lines per event
    stop.abort();
    assert.is(await done, 0);
    const heads = out.text.split('\n').filter((l) => /^\d+\/\d+  /.test(l));
    assert.is(heads.length, total);
    assert.match(heads[0], /^\d+\/\d+  meter-[0-9a-f]{12}-2026-11-24@1  \S+Z  MeterOpened$/);
  });

  it.run();
}
