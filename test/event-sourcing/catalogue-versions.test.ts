/**
 * Schema versions in a catalogue, and rolling upgrades: a process reads what the previous releases
 * wrote (upcast) and what the next release writes (its added fields dropped, the rest checked), and
 * refuses, saying why, a later version that is not only additive (that had to be a new event type).
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { defineEvent, eventCatalogue, EventSchemaViolation, schemaVersionKey, Type } from '../../src/event-sourcing/index.ts';

const Hold = Type.Object({ request_id: Type.String(), tokens: Type.Integer({ minimum: 0 }) }, { additionalProperties: false });
const Source = Type.Union([
  Type.Object({ kind: Type.Literal('api'), route: Type.String() }, { additionalProperties: false }),
  Type.Object({ kind: Type.Literal('cli') }, { additionalProperties: false }),
]);

/** This release: version 2 of MeterOpened (version 1 called `holds` `carried`). */
const MeterOpened = defineEvent(
  'MeterOpened',
  Type.Object(
    {
      day: Type.String(),
      balance: Type.Object({ input_tokens: Type.Integer(), output_tokens: Type.Integer() }, { additionalProperties: false }),
      holds: Type.Array(Hold),
      source: Source,
      note: Type.Optional(Type.String()),
    },
    { additionalProperties: false },
  ),
  { version: 2, upcasters: { 1: ({ carried, ...rest }: { carried: unknown[] }) => ({ ...rest, holds: carried }) } },
);
const MeterClosed = defineEvent('MeterClosed', Type.Object({ day: Type.String() }, { additionalProperties: false }));
const meterEvents = eventCatalogue('meter', [MeterOpened, MeterClosed]);

const opened = {
  day: '2026-11-24',
  balance: { input_tokens: 10, output_tokens: 20 },
  holds: [{ request_id: 'r1', tokens: 5 }],
  source: { kind: 'api', route: '/v1/completions' },
};
const at = (version: number | undefined, data: unknown) => ({
  type: 'MeterOpened',
  data,
  metadata: version === undefined ? {} : { [schemaVersionKey]: version },
  streamId: 'meter-k1-2026-11-24',
  streamVersion: 1,
});

function refusal(stored: ReturnType<typeof at>): EventSchemaViolation {
  try {
    meterEvents.parse(stored);
  } catch (error) {
    assert.instance(error, EventSchemaViolation);
    return error as EventSchemaViolation;
  }
  return assert.unreachable('the event should be refused') as never;
}

const it = suite('event catalogue: schema versions and rolling upgrades');

it('reads an event of the next release with an added top-level field and added nested fields, dropping them', () => {
  const written = {
    ...opened,
    region: 'eu-west', // new top-level field
    balance: { ...opened.balance, cached_tokens: 3 }, // new field in a nested object
    holds: [{ request_id: 'r1', tokens: 5, lease_holder: 'gw-2' }], // new field in an array's items
    source: { kind: 'api', route: '/v1/completions', client: 'sdk' }, // new field in a union's member
    note: 'carried',
  };
  const stored = at(3, written);
  const event = meterEvents.parse(stored);
  assert.equal(event, { type: 'MeterOpened', data: { ...opened, note: 'carried' } });
  assert.is((stored.data as { region?: string }).region, 'eu-west', 'the stored event itself is left as it was');
});

it('reads events of releases several versions ahead the same way', () => {
  assert.equal(meterEvents.parse(at(5, { ...opened, region: 'eu-west', later: { nested: true } })).data, opened);
  assert.equal(meterEvents.parse({ type: 'MeterClosed', data: { day: '2026-11-24', reason: 'rollover' }, metadata: { [schemaVersionKey]: 2 } }).data, { day: '2026-11-24' });
});

it('refuses an event of the next release that lacks a required field: a breaking change, which had to be a new event type', () => {
  const { balance: _dropped, ...withoutBalance } = opened;
  const error = refusal(at(3, { ...withoutBalance, region: 'eu-west' }));
  assert.is(error.eventType, 'MeterOpened');
  assert.match(error.message, /MeterOpened at meter-k1-2026-11-24@1/);
  assert.match(error.message, /schema version 3 by a later release \(this one reads up to 2\)/);
  assert.match(error.message, /balance/);
  assert.match(error.message, /a breaking change must be a new event type/);
});

it('refuses an event of the next release whose field changed type, nested ones included', () => {
  assert.match(refusal(at(3, { ...opened, day: 20261124 })).message, /\/day/);
  assert.match(refusal(at(3, { ...opened, holds: [{ request_id: 'r1', tokens: '5' }] })).message, /\/holds\/0\/tokens/);
});

it('still upcasts versions below its own: no schema_version is version 1', () => {
  const { holds, ...rest } = opened;
  const v1 = { ...rest, carried: holds };
  assert.equal(meterEvents.parse(at(undefined, v1)).data, opened);
  assert.equal(meterEvents.parse(at(1, v1)).data, opened);
  assert.equal(meterEvents.parse(at(2, opened)).data, opened);
});

it('an event at its own version is checked as written: an unknown field there is a bug, not an upgrade', () => {
  assert.match(refusal(at(2, { ...opened, region: 'eu-west' })).message, /region|unexpected|additional/i);
});

it('refuses a schema version that is not a whole number of at least 1', () => {
  for (const bad of [0, -1, 1.5]) assert.match(refusal(at(bad, opened)).message, /not a whole number of at least 1/);
});

it.run();
