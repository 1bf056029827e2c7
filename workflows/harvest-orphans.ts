/**
 * The harvest-orphans workflow: every admission is checked once, `harvestOrphanAdmissionMs` after it
 * (a timer it schedules for itself), against its job as the job's stream then holds it: a `Release`
 * on the key's quota stream, which the quota decider judges with its one rule (`harvestSlotFreed`).
 * A job that was never recorded (its submit died, or failed before recording it and could not record
 * the failure) is an orphan then, and its slot and count go back; a recorded job keeps its slot (its
 * end releases it: the harvest-slots workflow). So no admission holds a slot for longer than that
 * without a job. One instance per job; the release's id is derived from it (sent again, it appends nothing).
 */
import { defineEvent, eventCatalogue, scheduleInput, Type, type EventOf, type Workflow, type WorkflowInput } from '../src/event-sourcing/index.ts';
import { HarvestJobAdmitted, harvestQuotaKeyOf, harvestQuotaStream } from '../events/harvest.ts';
import { later } from '../events/shapes.ts';
import { harvestOrphanAdmissionMs, harvestQuotaDecider, type HarvestQuotaCommand, type ObservedJob } from '../deciders/harvest-quota.ts';

/** The scheduled input: the admission of `job_id` on `key_id`'s quota stream is due its check. */
export const HarvestAdmissionDue = defineEvent(
  'HarvestAdmissionDue',
  Type.Object({ job_id: Type.String(), key_id: Type.String(), admitted_at: Type.String() }, { additionalProperties: false }),
);

const orphanEvents = eventCatalogue('harvest-orphans', [HarvestJobAdmitted, HarvestAdmissionDue]);

export type HarvestOrphansInput = EventOf<typeof HarvestJobAdmitted> | EventOf<typeof HarvestAdmissionDue>;
type Release = Extract<HarvestQuotaCommand, { type: 'Release' }>;

/** The job as its stream holds it, read when an admission is due its check; null for any other input. */
export type HarvestOrphansView = ObservedJob | null;

export function harvestOrphansWorkflow(options: { read(jobId: string): Promise<ObservedJob> }): Workflow<HarvestOrphansInput, null, Release, HarvestOrphansView> {
  return {
    name: 'harvest-orphans',
    inputs: orphanEvents,
    inputTypes: ['HarvestJobAdmitted'],
    scheduledTypes: ['HarvestAdmissionDue'],
    target: harvestQuotaDecider,
    instanceOf: (input: WorkflowInput<HarvestOrphansInput>) => input.data.job_id,
    initialState: () => null,
    read: async (input) => (input.type === 'HarvestAdmissionDue' ? options.read(input.data.job_id) : null),
    decide(input, _state, job) {
      if (input.type === 'HarvestJobAdmitted') {
        const keyId = harvestQuotaKeyOf(input.streamId);
        if (keyId === null) return [];
        const { job_id: jobId, at } = input.data;
        return [scheduleInput(later(at, harvestOrphanAdmissionMs), `orphan:${jobId}`, HarvestAdmissionDue({ job_id: jobId, key_id: keyId, admitted_at: at }))];
      }
      // Judged at the time it fired, never at an assumed one: a job not recorded yet is an orphan only once a minute has passed.
      if (job === null || input.firedAt === undefined) return [];
      const { job_id: jobId, key_id: keyId } = input.data;
      return [{ stream: harvestQuotaStream(keyId), commandId: `orphan:${jobId}`, command: { type: 'Release', job, now: input.firedAt } }];
    },
    evolve: (state) => state,
  };
}
