/** The reaper and the spend watcher: a tick and what a read model says in, commands with derived ids out. */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { reapHolds, watchSpend } from '../../workflows/timed-workflows.ts';

const it = suite('timed workflows');
const now = '2026-11-26T12:00:00.000Z';
const hold = (requestId: string, expiresAt: string) => ({ requestId, streamId: `meter-k-2026-11-26`, expiresAt: new Date(expiresAt) });

it('the reaper expires each hold past its expiry on its own stream, under an id derived from the request', () => {
  const commands = reapHolds({ now }, { expired: [hold('a', '2026-11-26T11:59:00Z'), hold('b', now)], runningHere: new Set() });
  assert.equal(commands, [
    { stream: 'meter-k-2026-11-26', commandId: 'expire:a', command: { type: 'Expire', requestId: 'a', now } },
    { stream: 'meter-k-2026-11-26', commandId: 'expire:b', command: { type: 'Expire', requestId: 'b', now } },
  ]);
});

it('the reaper leaves a hold whose request still runs in this process (it renews it), and one not yet expired', () => {
  assert.equal(reapHolds({ now }, { expired: [hold('a', '2026-11-26T11:00:00Z'), hold('c', '2026-11-26T12:00:01Z')], runningHere: new Set(['a']) }), []);
});

it("the reaper also sends a hold made more than a slot lease ago to expiry (its process's lease may have lapsed: the meter decider judges), unless it runs here", () => {
  const made = (requestId: string, reservedAt: string) => ({ ...hold(requestId, '2026-11-26T12:20:00Z'), reservedAt: new Date(reservedAt) });
  const expired = [made('old', '2026-11-26T11:59:00Z'), made('young', '2026-11-26T11:59:00.001Z'), made('mine', '2026-11-26T11:00:00Z')];
  assert.equal(reapHolds({ now }, { expired, runningHere: new Set(['mine']), leaseTtlMs: 60_000 }), [
    { stream: 'meter-k-2026-11-26', commandId: 'expire:old', command: { type: 'Expire', requestId: 'old', now } },
  ]);
  // Without a lease TTL only the expiry counts.
  assert.equal(reapHolds({ now }, { expired, runningHere: new Set() }), []);
});

it('the same tick decided twice (a reaper that died half-way) sends the same commands, which their ids make harmless', () => {
  const view = { expired: [hold('a', '2026-11-26T11:59:00Z')], runningHere: new Set<string>() };
  assert.equal(reapHolds({ now }, view), reapHolds({ now }, view));
});

it("the spend watcher reports the day's spend to the day's spend stream, the threshold left to its decider", () => {
  assert.equal(watchSpend({ now }, { spendMicros: 12_500_000, capMicros: 100_000_000, reachedDay: null }), [
    { stream: 'spend-2026-11-26', commandId: 'spend-check:2026-11-26:12500000', command: { type: 'CheckSpend', day: '2026-11-26', spendMicros: 12_500_000, capMicros: 100_000_000, now } },
  ]);
});

it('the spend watcher sends nothing with no cap, or once the cap is known reached today', () => {
  assert.equal(watchSpend({ now }, { spendMicros: 500, capMicros: null, reachedDay: null }), []);
  assert.equal(watchSpend({ now }, { spendMicros: 500, capMicros: 100, reachedDay: '2026-11-26' }), []);
  assert.is(watchSpend({ now }, { spendMicros: 500, capMicros: 100, reachedDay: '2026-11-25' }).length, 1, "yesterday's cap does not hold today");
});

it.run();
