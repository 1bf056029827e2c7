/**
 * The harvest quota decider, given / when / then: the month's count is the jobs admitted in that UTC
 * month minus those whose start failed, a new month starts at 0, 0 or null is unlimited, the running
 * cap counts slots not yet released, and of the key's jobs as the caller read them, those that ended
 * (or whose stream never appeared a minute after their admission) are released in the admission.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { harvestJobsCounted, harvestOrphanAdmissionMs, harvestQuotaDecider, harvestSlotFreed, type HarvestQuotaCommand, type ObservedJob } from '../../deciders/harvest-quota.ts';
import { HarvestJobAdmitted, harvestQuotaStream, HarvestSlotReleased, utcMonth } from '../../events/harvest.ts';
import { deciderSpecification } from '../support/decider-specification.ts';

const it = suite('harvest quota decider');
const spec = deciderSpecification(harvestQuotaDecider);
const nov = (day: number, hour = 12) => `2026-11-${String(day).padStart(2, '0')}T${String(hour).padStart(2, '0')}:00:00.000Z`;
const dec1 = '2026-12-01T00:00:00.000Z';
const job = (n: number) => `hj_job${n}`;

const admit = (n: number, now: string, over: Partial<Extract<HarvestQuotaCommand, { type: 'Admit' }>> = {}): HarvestQuotaCommand => ({
  type: 'Admit',
  jobId: job(n),
  now,
  monthlyQuota: 3,
  runningCap: 2,
  staleAfterMs: 30 * 60_000,
  jobs: [],
  ...over,
});
const admitted = (n: number, at: string) => HarvestJobAdmitted({ job_id: job(n), month: utcMonth(at), at });
type Reason = 'ended' | 'orphan' | 'stale';
const released = (n: number, counted: boolean, at: string, reason: Reason = 'ended') => HarvestSlotReleased({ job_id: job(n), counted, reason, at });
const seen = (n: number, status: ObservedJob['status'], counted = status !== 'none', lastProgressAt: string | null = null): ObservedJob => ({ jobId: job(n), status, counted, lastProgressAt });
const release = (n: number, status: ObservedJob['status'], now: string, counted = status !== 'none' && status !== 'failed'): HarvestQuotaCommand => ({ type: 'Release', job: seen(n, status, counted), now });

it('the stream is harvest-quota-<keyId>; months are UTC', () => {
  assert.is(harvestQuotaStream('0c8190d112da'), 'harvest-quota-0c8190d112da');
  assert.is(utcMonth('2026-11-30T23:59:59.999Z'), '2026-11');
  assert.is(utcMonth('2026-12-01T00:00:00.000+01:00'), '2026-11');
});

it('a job under the quota and the cap is admitted, in its UTC month', () => {
  spec.given([]).when(admit(1, nov(2))).then([admitted(1, nov(2))]);
  spec.given([]).when(admit(1, nov(2))).thenState((s) => assert.equal([s.month, s.counted, [...s.active.keys()]], ['2026-11', 1, [job(1)]]));
});

it('the monthly quota: reached, the next job is refused with the quota and what was used', () => {
  const three = [admitted(1, nov(2)), released(1, true, nov(3)), admitted(2, nov(4)), released(2, true, nov(5)), admitted(3, nov(6)), released(3, true, nov(7))];
  spec.given(three).when(admit(4, nov(8))).thenRejects('harvest_quota_exceeded', { quota: 3, used: 3 });
  spec.given(three.slice(0, 4)).when(admit(4, nov(8))).then([admitted(4, nov(8))]);
});

it('the quota counts only jobs admitted this month minus those whose start failed', () => {
  const threeOneStartFailed = [admitted(1, nov(2)), released(1, false, nov(2)), admitted(2, nov(4)), released(2, true, nov(5)), admitted(3, nov(6)), released(3, true, nov(7))];
  spec.given(threeOneStartFailed).when(admit(4, nov(8))).then([admitted(4, nov(8))]);
  spec.given(threeOneStartFailed).when(admit(4, nov(8))).thenState((s) => assert.is(harvestJobsCounted(s, '2026-11'), 3));
});

it('a new UTC month starts the count at 0 (a job admitted last month and still running keeps its slot)', () => {
  const full = [admitted(1, nov(2)), released(1, true, nov(3)), admitted(2, nov(4)), released(2, true, nov(5)), admitted(3, nov(30, 23))];
  spec.given(full).when(admit(4, '2026-11-30T23:59:59.999Z')).thenRejects('harvest_quota_exceeded', { quota: 3, used: 3 });
  spec.given(full).when(admit(4, dec1)).then([admitted(4, dec1)]);
  spec.given(full).when(admit(4, dec1)).thenState((s) => assert.equal([s.month, s.counted, s.active.size], ['2026-12', 1, 2]));
  // last month's job whose start failed gives nothing back to this month
  spec.given([...full, admitted(4, dec1), released(3, false, dec1)]).when(admit(5, dec1)).thenState((s) => assert.is(s.counted, 2));
});

it('a monthly quota of 0 or null is unlimited', () => {
  const many = [1, 2, 3, 4, 5].flatMap((n) => [admitted(n, nov(n)), released(n, true, nov(n, 13))]);
  spec.given(many).when(admit(6, nov(9), { monthlyQuota: 0 })).then([admitted(6, nov(9))]);
  spec.given(many).when(admit(6, nov(9), { monthlyQuota: null })).then([admitted(6, nov(9))]);
  spec.given(many).when(admit(6, nov(9), { monthlyQuota: 5 })).thenRejects('harvest_quota_exceeded', { quota: 5, used: 5 });
});

it('the running cap: jobs admitted and not released count, whatever their month; a cap of 0 is none', () => {
  const two = [admitted(1, nov(30)), admitted(2, dec1)];
  spec.given(two).when(admit(3, dec1, { monthlyQuota: null })).thenRejects('harvest_concurrency_exceeded', { cap: 2, running: 2 });
  spec.given([...two, released(1, true, dec1)]).when(admit(3, dec1, { monthlyQuota: null })).then([admitted(3, dec1)]);
  spec.given(two).when(admit(3, dec1, { monthlyQuota: null, runningCap: 0 })).then([admitted(3, dec1)]);
});

it('the quota is checked before the cap', () => {
  spec.given([admitted(1, nov(2)), admitted(2, nov(3))]).when(admit(3, nov(4), { monthlyQuota: 2 })).thenRejects('harvest_quota_exceeded');
});

it('of the jobs passed to Admit, the ended ones are released first, in the same decision (active ones only, once each)', () => {
  const two = [admitted(1, nov(2)), admitted(2, nov(3))];
  const jobs = [seen(1, 'succeeded'), seen(2, 'running'), seen(9, 'failed'), seen(1, 'succeeded')];
  spec.given(two).when(admit(3, nov(4), { jobs })).then([released(1, true, nov(4)), admitted(3, nov(4))]);
  spec.given(two).when(admit(3, nov(4), { jobs: [seen(1, 'cancelled'), seen(2, 'failed')] })).then([released(1, true, nov(4)), released(2, true, nov(4)), admitted(3, nov(4))]);
  spec.given(two).when(admit(3, nov(4), { jobs: [seen(1, 'pending'), seen(2, 'running')] })).thenRejects('harvest_concurrency_exceeded', { cap: 2, running: 2 });
});

it('an ended job whose start failed, released in the admission, gives its quota back to it', () => {
  const full = [admitted(1, nov(2)), admitted(2, nov(3)), released(2, true, nov(3)), admitted(3, nov(4)), released(3, true, nov(4))];
  spec.given(full).when(admit(4, nov(5))).thenRejects('harvest_quota_exceeded', { used: 3 });
  spec.given(full).when(admit(4, nov(5), { jobs: [seen(1, 'failed', false)] })).then([released(1, false, nov(5)), admitted(4, nov(5))]);
});

it('an admission whose job stream never appeared is an orphan a minute after it: released uncounted; before that it holds its slot', () => {
  const at = '2026-11-02T12:00:00.000Z';
  const later = (ms: number) => new Date(Date.parse(at) + ms).toISOString();
  const one = [admitted(1, at), admitted(2, at)];
  spec.given(one).when(admit(3, later(harvestOrphanAdmissionMs), { jobs: [seen(1, 'none'), seen(2, 'pending')] })).then([released(1, false, later(harvestOrphanAdmissionMs), 'orphan'), admitted(3, later(harvestOrphanAdmissionMs))]);
  spec.given(one).when(admit(3, later(harvestOrphanAdmissionMs - 1), { jobs: [seen(1, 'none'), seen(2, 'pending')] })).thenRejects('harvest_concurrency_exceeded');
  spec.given(one).when(admit(3, later(harvestOrphanAdmissionMs), { jobs: [seen(1, 'none'), seen(2, 'pending')] })).thenState((s) => assert.is(harvestJobsCounted(s, '2026-11'), 2));
});

it('harvestSlotFreed: an ended job as counted as it was, an orphan uncounted, a stale one (given the stale time) counted, anything else holds its slot', () => {
  const at = nov(2);
  assert.equal(harvestSlotFreed(at, seen(1, 'succeeded'), at), { counted: true, reason: 'ended' });
  assert.equal(harvestSlotFreed(at, seen(1, 'failed', false), at), { counted: false, reason: 'ended' });
  assert.equal(harvestSlotFreed(at, seen(1, 'cancelled'), at), { counted: true, reason: 'ended' });
  assert.is(harvestSlotFreed(at, seen(1, 'running', true, at), nov(30)), null, 'a running job, however old, without the stale time');
  assert.is(harvestSlotFreed(at, seen(1, 'pending', true, at), nov(30)), null);
  assert.equal(harvestSlotFreed(at, seen(1, 'running', true, at), nov(30), 30 * 60_000), { counted: true, reason: 'stale' });
  assert.is(harvestSlotFreed(at, seen(1, 'running', true, nov(29, 23)), nov(30), 30 * 60 * 60_000), null, 'progress within the stale time');
  assert.is(harvestSlotFreed(at, seen(1, 'none'), at), null);
  assert.equal(harvestSlotFreed(at, seen(1, 'none'), nov(3)), { counted: false, reason: 'orphan' });
  assert.equal(harvestSlotFreed(at, seen(1, 'none'), nov(3), 1), { counted: false, reason: 'orphan' }, 'an orphan is never stale');
});

it('Admit frees the slot of a job that its stream says is stale (no progress for the stale time), counted; the job is aged out after it', () => {
  const two = [admitted(1, nov(2)), admitted(2, nov(3))];
  const stuck = seen(1, 'running', true, nov(2, 12));
  const moving = seen(2, 'running', true, '2026-11-02T12:01:00.000Z');
  const at = '2026-11-02T12:30:00.000Z';
  spec.given(two).when(admit(3, at, { jobs: [stuck, moving] })).then([released(1, true, at, 'stale'), admitted(3, at)]);
  spec.given(two).when(admit(3, at, { jobs: [stuck, moving] })).thenState((s) => assert.equal([[...s.active.keys()], s.counted], [[job(2), job(3)], 3]));
  spec.given(two).when(admit(3, '2026-11-02T12:29:59.999Z', { jobs: [stuck, moving] })).thenRejects('harvest_concurrency_exceeded', { cap: 2, running: 2 });
  spec.given(two).when(admit(3, at, { jobs: [seen(1, 'pending', true, nov(2, 12)), moving] })).then([released(1, true, at, 'stale'), admitted(3, at)]);
});

it('a job already admitted is not admitted twice (a retried submit under another command id)', () => {
  spec.given([admitted(1, nov(2))]).when(admit(1, nov(2))).thenNothing();
  spec.given([admitted(1, nov(2)), admitted(2, nov(3))]).when(admit(1, nov(3), { jobs: [seen(2, 'succeeded')] })).then([released(2, true, nov(3))]);
});

it('Release judges the job as its stream holds it by the same rule: an ended job frees its slot, counted as it was', () => {
  spec.given([admitted(1, nov(2))]).when(release(1, 'succeeded', nov(3))).then([released(1, true, nov(3))]);
  spec.given([admitted(1, nov(2))]).when(release(1, 'failed', nov(3), false)).thenState((s) => assert.equal([s.active.size, s.counted], [0, 0]));
  spec.given([admitted(1, nov(2))]).when(release(1, 'cancelled', nov(3))).thenState((s) => assert.equal([s.active.size, s.counted], [0, 1]));
  spec.given([admitted(1, nov(2)), released(1, true, nov(3))]).when(release(1, 'succeeded', nov(4))).thenNothing();
  spec.given([]).when(release(1, 'succeeded', nov(4))).thenNothing();
});

it('Release of a job never recorded frees its slot uncounted once it is an orphan (a minute after its admission), not before; a recorded job, however old, keeps it', () => {
  const at = '2026-11-02T12:00:00.000Z';
  const later = (ms: number) => new Date(Date.parse(at) + ms).toISOString();
  spec.given([admitted(1, at)]).when(release(1, 'none', later(harvestOrphanAdmissionMs))).then([released(1, false, later(harvestOrphanAdmissionMs), 'orphan')]);
  spec.given([admitted(1, at)]).when(release(1, 'none', later(harvestOrphanAdmissionMs))).thenState((s) => assert.equal([s.active.size, harvestJobsCounted(s, '2026-11')], [0, 0]));
  spec.given([admitted(1, at)]).when(release(1, 'none', later(harvestOrphanAdmissionMs - 1))).thenNothing();
  spec.given([admitted(1, at)]).when(release(1, 'pending', nov(30))).thenNothing();
  spec.given([admitted(1, at)]).when(release(1, 'running', nov(30))).thenNothing();
});

it.run();
