/**
 * The per-key rate rule checked on what the meter recorded, so a test holds on a machine too slow to
 * send its requests inside one minute: no rolling minute holds more than `limit` request starts, and
 * every `rate_limited` refusal came when the minute before it already held `limit` starts.
 */
import * as assert from 'uvu/assert';
import type { MeterEvent } from '../../events/meter.ts';

const minuteMs = 60_000;
/** A refusal is recorded a moment after it was decided (the route records it while answering). */
const recordingLagMs = 2_000;

export function assertRollingMinuteLimit(events: readonly MeterEvent[], limit: number): void {
  const starts = events.flatMap((e) => (e.type === 'BudgetReserved' ? [Date.parse(e.data.at)] : [])).sort((a, b) => a - b);
  let from = 0;
  for (let i = 0; i < starts.length; i++) {
    while (starts[from] <= starts[i] - minuteMs) from++;
    assert.ok(i - from + 1 <= limit, `${i - from + 1} request starts in the minute ending ${new Date(starts[i]).toISOString()}`);
  }
  for (const e of events) {
    if (e.type !== 'RequestRejected' || e.data.code !== 'rate_limited') continue;
    const at = Date.parse(e.data.at);
    const before = starts.filter((t) => t <= at && t > at - minuteMs - recordingLagMs).length;
    assert.ok(before >= limit, `refused at ${e.data.at} with only ${before} starts in the minute before`);
  }
}
