/**
 * The carried-holds workflow: a hold still open at midnight is carried into the next meter day (it
 * keeps one of the key's active slots there and counts against the month), and is ended on its own
 * day's stream (settled, or expired by the reaper). Every day that carried it must then release it.
 *
 * The two facts arrive in either order, from different streams: the next day's MeterOpened (carrying
 * the hold) and the CarriedHoldEnded that the meter decider adds to a settlement or expiry on a closed
 * day. One instance per key remembers whichever came first; when both are known it sends
 * ReleaseCarried to the carrying day, with an id derived from the hold and that day. Nothing else on
 * the log is read: a settlement on an open day is not carried anywhere.
 */
import type { Workflow, WorkflowCommand, WorkflowInput } from '../src/event-sourcing/index.ts';
import { meterEvents, meterStream, meterStreamParts, type MeterEvent } from '../events/meter.ts';
import { dayAfter } from '../events/shapes.ts';
import { meterDecider, type MeterCommand } from '../deciders/meter.ts';

type Input = Extract<MeterEvent, { type: 'MeterOpened' | 'CarriedHoldEnded' }>;
type Release = Extract<MeterCommand, { type: 'ReleaseCarried' }>;

export interface CarriedHoldsState {
  /** Holds carried into later days and not yet ended: their own day and the days carrying them. */
  readonly carried: Readonly<Record<string, { readonly day: string; readonly into: readonly string[] }>>;
  /** Holds ended on a closed day: what was charged there, for a day that opens carrying them later. */
  readonly ended: Readonly<Record<string, { readonly day: string; readonly input: number; readonly output: number }>>;
}

/** The opening balance reaches back 31 days at most: a hold ended longer ago than that is never carried again. */
const rememberDays = 32;

const release = (keyId: string, into: string, requestId: string, ended: CarriedHoldsState['ended'][string], at: string): WorkflowCommand<Release> => ({
  stream: meterStream(keyId, into),
  commandId: `release:${requestId}:${into}`,
  command: { type: 'ReleaseCarried', requestId, day: ended.day, inputTokens: ended.input, outputTokens: ended.output, now: at },
});

const keyOf = (input: WorkflowInput<Input>): string => (input.type === 'MeterOpened' ? input.data.key_id : meterStreamParts(input.streamId)!.keyId);

export const carriedHoldsWorkflow: Workflow<Input, CarriedHoldsState, Release> = {
  name: 'carried-holds',
  inputs: meterEvents,
  inputTypes: ['MeterOpened', 'CarriedHoldEnded'],
  target: meterDecider,
  instanceOf: keyOf,
  initialState: () => ({ carried: {}, ended: {} }),
  decide(input, state) {
    const keyId = keyOf(input);
    if (input.type === 'MeterOpened') {
      return input.data.carried_holds.flatMap((h) => {
        const ended = state.ended[h.request_id];
        return ended && ended.day === h.day ? [release(keyId, input.data.day, h.request_id, ended, input.data.at)] : [];
      });
    }
    const { request_id: requestId, day, input_tokens: inputTokens, output_tokens: outputTokens, at } = input.data;
    const ended = { day, input: inputTokens, output: outputTokens };
    return (state.carried[requestId]?.into ?? []).map((into) => release(keyId, into, requestId, ended, at));
  },
  evolve(state, message) {
    if (message.kind === 'output') return state; // a release changes nothing more: the hold's facts stay known
    const input = message.input;
    if (input.type === 'CarriedHoldEnded') {
      const { request_id: requestId, day, input_tokens: inputTokens, output_tokens: outputTokens } = input.data;
      const { [requestId]: _released, ...carried } = state.carried;
      return { carried, ended: { ...state.ended, [requestId]: { day, input: inputTokens, output: outputTokens } } };
    }
    const { day: opened, carried_holds: holds } = input.data;
    const stillOpen = holds.filter((h) => !state.ended[h.request_id]);
    if (stillOpen.length === 0 && holds.length === 0) return state;
    const carried = { ...state.carried };
    for (const h of stillOpen) {
      const known = carried[h.request_id];
      carried[h.request_id] = { day: h.day, into: known ? [...known.into.filter((d) => d !== opened), opened] : [opened] };
    }
    const forgetBefore = dayAfter(opened, -rememberDays);
    const ended = Object.fromEntries(Object.entries(state.ended).filter(([, e]) => e.day >= forgetBefore));
    return { carried, ended };
  },
};
