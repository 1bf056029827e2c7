/**
 * The carried-holds workflow, given / when / then: a hold carried into a later day is released there
 * once it has ended on its own day, whichever of the two facts reaches the log first.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { carriedHoldsWorkflow } from '../../workflows/carried-holds.ts';
import { CarriedHoldEnded, MeterOpened, meterStream } from '../../events/meter.ts';
import { workflowSpecification } from '../support/workflow-specification.ts';

const it = suite('carried-holds workflow');
const spec = workflowSpecification(carriedHoldsWorkflow);
const key = 'key-1';
let ids = 0;

const hold = (requestId: string, day: string) => ({
  request_id: requestId,
  day,
  input_tokens: 5,
  output_tokens: 100,
  at: `${day}T23:59:00.000Z`,
  expires_at: `${day}T23:59:30.000Z`,
  lease_holder: null,
});

function opened(day: string, carried: { requestId: string; day: string }[], from: string | null = carried[0]?.day ?? null) {
  const data = {
    key_id: key,
    day,
    month_input_tokens: 0,
    month_output_tokens: 0,
    carried_from: from,
    carried_holds: carried.map((c) => hold(c.requestId, c.day)),
    carried_leases: [],
    carried_queue: [],
    recent_starts: [],
    at: `${day}T00:00:01.000Z`,
  };
  return { ...MeterOpened(data as Parameters<typeof MeterOpened>[0]), id: `e${++ids}`, streamId: meterStream(key, day) };
}

function ended(day: string, requestId: string, output = 40, at = `${nextDay(day)}T00:00:02.000Z`) {
  return { ...CarriedHoldEnded({ request_id: requestId, day, input_tokens: 5, output_tokens: output, at }), id: `e${++ids}`, streamId: meterStream(key, day) };
}

function nextDay(day: string, n = 1): string {
  return new Date(Date.parse(`${day}T00:00:00Z`) + n * 86_400_000).toISOString().slice(0, 10);
}

const release = (into: string, requestId: string, day: string, output: number, now: string) => ({
  stream: meterStream(key, into),
  commandId: `release:${requestId}:${into}`,
  command: { type: 'ReleaseCarried' as const, requestId, day, inputTokens: 5, outputTokens: output, now },
});

const D = '2026-11-24';
const D1 = nextDay(D);
const D2 = nextDay(D, 2);

it('a hold ended after the next day opened carrying it: released there, charging what its own day charged', () => {
  spec
    .given([opened(D1, [{ requestId: 'x', day: D }])])
    .when(ended(D, 'x', 40, `${D1}T00:05:00.000Z`))
    .then([release(D1, 'x', D, 40, `${D1}T00:05:00.000Z`)]);
});

it('a hold ended between the close of its day and the opening of the next: released when the next day opens carrying it', () => {
  spec
    .given([ended(D, 'x', 40, `${D1}T00:00:00.500Z`)])
    .when(opened(D1, [{ requestId: 'x', day: D }]))
    .then([release(D1, 'x', D, 40, `${D1}T00:00:01.000Z`)]);
});

it('a hold carried over two midnights is released on every day that carried it', () => {
  spec
    .given([opened(D1, [{ requestId: 'x', day: D }]), opened(D2, [{ requestId: 'x', day: D }], D1)])
    .when(ended(D, 'x', 7, `${D2}T00:10:00.000Z`))
    .then([release(D1, 'x', D, 7, `${D2}T00:10:00.000Z`), release(D2, 'x', D, 7, `${D2}T00:10:00.000Z`)]);
});

it('a day opened from one whose release came too late carries the hold again, and is released too', () => {
  spec
    .given([opened(D1, [{ requestId: 'x', day: D }]), ended(D, 'x', 40, `${D1}T00:05:00.000Z`)])
    .when(opened(D2, [{ requestId: 'x', day: D }], D1))
    .then([release(D2, 'x', D, 40, `${D2}T00:00:01.000Z`)]);
});

it('only the holds that ended are released; the others wait for their end', () => {
  spec
    .given([ended(D, 'x', 40, `${D1}T00:00:00.500Z`)])
    .when(opened(D1, [{ requestId: 'x', day: D }, { requestId: 'y', day: D }]))
    .then([release(D1, 'x', D, 40, `${D1}T00:00:01.000Z`)]);
  spec
    .given([ended(D, 'x', 40, `${D1}T00:00:00.500Z`), opened(D1, [{ requestId: 'x', day: D }, { requestId: 'y', day: D }])])
    .when(ended(D, 'y', 3, `${D1}T00:01:00.000Z`))
    .then([release(D1, 'y', D, 3, `${D1}T00:01:00.000Z`)]);
});

it('a day opened carrying nothing changes nothing and is not recorded', () => {
  spec.given([]).when(opened(D1, [])).thenNothing();
});

it('an opening carrying a hold still running remembers it, and sends nothing yet', () => {
  spec
    .given([])
    .when(opened(D1, [{ requestId: 'x', day: D }]))
    .thenState((state) => {
      assert.equal(state.carried, { x: { day: D, into: [D1] } });
    });
});

it('an ended hold is remembered while a later opening could still carry it (31 days), then forgotten', () => {
  const later = nextDay(D, 40);
  spec
    .given([ended(D, 'x')])
    .when(opened(later, [{ requestId: 'y', day: nextDay(later, -1) }]))
    .thenState((state) => {
      assert.equal(Object.keys(state.ended), []);
    });
  spec
    .given([ended(D, 'x')])
    .when(opened(nextDay(D, 20), [{ requestId: 'y', day: nextDay(D, 19) }]))
    .thenState((state) => {
      assert.equal(Object.keys(state.ended), ['x']);
    });
});

it('one instance per key: both inputs of a hold land on the same state', () => {
  assert.is(spec.given([]).when(opened(D1, [{ requestId: 'x', day: D }])).instance(), key);
  assert.is(spec.given([]).when(ended(D, 'x')).instance(), key);
});

it.run();
