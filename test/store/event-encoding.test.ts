/** The escaping of strings jsonb refuses, on its own: bijective, and free for events that need none. */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { decodeEscaped, encodeEvents, escapedMark, isEscaped, toStorableText } from '../../src/store/event-encoding.ts';

const it = suite('event encoding');

/** What PostgreSQL's json parser refuses in jsonb: a `\u0000` escape, a lone surrogate's escape. */
const refusedByJsonb = /(?<!\\)(?:\\\\)*\\u(?:0000|d[89a-f])/;

/** Stored as the database would: the JSON parsed (jsonb keeps no more than that), then read back. */
function roundTrip(events: { data?: unknown; metadata?: Record<string, unknown> }[]) {
  const encoded = encodeEvents(events);
  assert.not.match(encoded.data, refusedByJsonb);
  assert.not.match(encoded.metadata, refusedByJsonb);
  const data = JSON.parse(`[${encoded.data}]`) as unknown[];
  const metadata = JSON.parse(`[${encoded.metadata}]`) as Record<string, unknown>[];
  return data.map((d, i) => (isEscaped(metadata[i]) ? decodeEscaped(d, metadata[i]) : { data: d, metadata: metadata[i] }));
}

it('events without refused strings are serialized exactly as JSON.stringify writes them, unmarked', () => {
  const events = [{ data: { a: '😀 \uE000 \\u0000 \u0001' }, metadata: { k: 'v' } }, { data: null }, { data: [1, 'x'] }];
  const encoded = encodeEvents(events);
  assert.is(`[${encoded.data}]`, JSON.stringify(events.map((e) => e.data ?? null)));
  assert.is(`[${encoded.metadata}]`, JSON.stringify(events.map((e) => e.metadata ?? {})));
});

it('only the events that need it are escaped and marked', () => {
  const encoded = encodeEvents([{ data: { a: 'plain \uE000' } }, { data: { a: 'x\u0000' } }]);
  const metadata = JSON.parse(`[${encoded.metadata}]`);
  assert.equal(metadata.map(isEscaped), [false, true]);
  assert.equal(JSON.parse(`[${encoded.data}]`)[0], { a: 'plain \uE000' });
});

it('10,000 random strings of the awkward code units, as values and keys, come back byte for byte', () => {
  const alphabet = ['\u0000', '\ud800', '\udbff', '\udc00', '\udfff', '\uE000', '\\', 'u', '0', 'd', '8', 'e', '"', 'a', '😀', 'ש', '\u0001', escapedMark];
  const random = () => Array.from({ length: Math.floor(Math.random() * 8) }, () => alphabet[Math.floor(Math.random() * alphabet.length)]).join('');
  for (let round = 0; round < 1000; round++) {
    const events = Array.from({ length: 10 }, () => {
      const data: Record<string, unknown> = {};
      const metadata: Record<string, unknown> = {};
      for (let i = 0; i < 3; i++) {
        data[random()] = [random(), { [random()]: random() }];
        metadata[random()] = random();
      }
      return { data, metadata };
    });
    assert.equal(roundTrip(events), events.map((e) => ({ data: e.data, metadata: e.metadata })));
  }
});

it('toStorableText maps what a text column refuses to the escaped events\' sequences, and leaves other text alone', () => {
  const plain = 'ordinary 😀 שלום';
  assert.is(toStorableText(plain), plain);
  assert.is(toStorableText('x\u0000y\ud800\uE000😀\udc00'), 'x\uE0000000y\uE000d800\uE000e000😀\uE000dc00');
  // the same form as a string of an escaped event
  const encoded = encodeEvents([{ data: 'x\u0000y\ud800\uE000😀' }]);
  assert.is(JSON.parse(encoded.data), toStorableText('x\u0000y\ud800\uE000😀'));
});

it.run();
