/**
 * The workflow processor's timers (see workflow-processor.ts): the lease holder gives each scheduled
 * input once when due, by the processor's clock, in its own transaction; a periodic workflow with no
 * timer pending is seeded first. What they need of the processor comes in a `TimerContext`.
 */
import type { SqlDatabase, SqlTransaction, NewEvent } from '../store/index.ts';
import { eventIdFor } from '../command-handler/index.ts';
import { outputRecord, reactTo, schemaVersionKey, type DomainEvent, type WorkflowInput } from '../event-sourcing/index.ts';
import type { TimerRow, TimerStore } from './timers.ts';
import { addReaction, timerRow, type AnyWorkflow, type Instance, type Output, type Records, type Running } from './workflow-instances.ts';

export interface TimerContext {
  readonly db: SqlDatabase;
  readonly timers: TimerStore;
  now(): Date;
  /** How often the processor's idle round looks for due timers anyway. */
  readonly idleMs: number;
  expectHeld(running: Running): void;
  holds(running: Running): boolean;
  instance(running: Running, id: string): Promise<Instance>;
  send(running: Running, outputs: readonly Output[]): Promise<void>;
  commit(running: Running, records: Records, alsoInTx: (tx: SqlTransaction) => Promise<void>): Promise<void>;
  fireSoon(running: Running): void;
}

export const hasTimers = (workflow: AnyWorkflow): boolean => (workflow.scheduledTypes?.length ?? 0) > 0;

/** Gives every timer due now, held here: each its own transaction; then waits for the next. */
export async function fireDue(ctx: TimerContext, running: Running): Promise<void> {
  if (!running.active || !ctx.holds(running)) return;
  const { workflow } = running;
  if (!running.seeded) {
    await seed(ctx, running);
    running.seeded = true;
  }
  let fired = false;
  let next: Date | null = null;
  for (let more = true; more; ) {
    const now = ctx.now();
    const { due, later } = await ctx.timers.due(ctx.db, workflow.name, now, 100);
    for (const row of due) await fire(ctx, running, row, now);
    fired ||= due.length > 0;
    more = due.length === 100;
    next = later;
  }
  if (running.wake) clearTimeout(running.wake);
  running.wake = null;
  // Firing may have scheduled more (an earlier one, even): asked again then; an idle round has its answer.
  if (fired) next = await ctx.timers.next(ctx.db, workflow.name);
  const waitMs = next === null ? Infinity : next.getTime() - ctx.now().getTime();
  // Later than the next idle round: that round looks again (a clock moved by a test is seen there too).
  if (!running.active || waitMs > ctx.idleMs) return;
  running.wake = setTimeout(() => {
    running.wake = null;
    ctx.fireSoon(running);
  }, Math.max(0, waitMs));
  running.wake.unref();
}

/** One due timer: its input decided on the instance's state, its commands sent, then recorded with it marked fired. */
async function fire(ctx: TimerContext, running: Running, row: TimerRow, now: Date): Promise<void> {
  ctx.expectHeld(running);
  const { workflow } = running;
  const checked = workflow.inputs.parse({ type: row.input.type, data: row.input.data, metadata: { [schemaVersionKey]: row.input.schemaVersion } });
  const input = { ...checked, id: row.timerId, streamId: row.stream, firedAt: now.toISOString() } as WorkflowInput<DomainEvent>;
  const instance = await ctx.instance(running, workflow.instanceOf(input));
  const records: Records = { events: new Map(), timers: [] };
  if (instance.recorded?.has(row.timerId)) {
    records.timers.push(...(instance.scheduledBy?.get(row.timerId) ?? [])); // fired before a crash kept it from being marked
  } else {
    const reaction = reactTo(workflow, instance.state, input, workflow.read ? await workflow.read(input, instance.state) : undefined)!;
    addReaction(workflow, records, instance, input, reaction);
    await ctx.send(running, reaction.outputs);
  }
  await ctx.commit(running, records, (tx) => ctx.timers.fired(tx, workflow.name, [row.timerId], now));
}

/** A periodic workflow with no timer pending (its first start, or a chain that ended): its seeds scheduled. */
async function seed(ctx: TimerContext, running: Running): Promise<void> {
  const { workflow } = running;
  if (!workflow.seed || (await ctx.timers.next(ctx.db, workflow.name)) !== null) return;
  const records: Records = { events: new Map(), timers: [] };
  for (const seed of workflow.seed(ctx.now().toISOString())) {
    const { timerId, input } = seed.schedule;
    const instance = await ctx.instance(running, workflow.instanceOf({ ...input, id: timerId, streamId: '' } as WorkflowInput<DomainEvent>));
    const e = outputRecord(workflow, seed);
    const pending = records.events.get(instance);
    const event: NewEvent = { id: eventIdFor(`${workflow.name}:seed:${timerId}`, 0), type: e.type, data: e.data, metadata: { [schemaVersionKey]: 1, input_event_id: `seed:${timerId}` } };
    records.events.set(instance, { state: workflow.evolve(pending ? pending.state : instance.state, { kind: 'output', output: seed }), events: [...(pending?.events ?? []), event] });
    records.timers.push(timerRow(workflow, instance.stream, seed));
  }
  await ctx.commit(running, records, async () => {});
}
