import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Buffer } from 'node:buffer';
import { Base64Decoder, CodecError, CodecScanner, encodeTensor, encodeTensorZstd, zstdDecompressInto, type CodecLocation } from '../../src/codec/index.ts';

// Strings elsewhere in the body carry every trap a scanner could fall into: escaped quotes and
// backslashes, \u escapes, braces and brackets, and the codec's own key names as text.
const trapText = 'say \\"hi\\" \\\\ {\\"activations\\":{\\"residual_stream\\":{\\"shape\\":[99]}}} [\\u00e9\\ud83d\\ude00] \\n\\t';

function body(codec: object, { before = true }: { before?: boolean } = {}): Buffer {
  const head = `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"${trapText}","logprobs":{"tokens":["a"],"token_logprobs":[-0.5e-3],"top_logprobs":[{"a":-1.25E+2}],"text_offset":[0]},"finish_reason":"length","stop_reason":null,"prompt_logprobs":[null,{"5":{"logprob":-2,"rank":1,"decoded_token":"data"}}]}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}`;
  const extra = `"residual":{"data":"AAAA","shape":[1]},"other":{"residual_stream":{"shape":[7]}}`;
  const acts = `"activations":{"residual_stream":${JSON.stringify(codec)},"qk_layers":{"__json__":[2]}}`;
  return Buffer.from(before ? `${head},${extra},${acts}}` : `{${acts},${head.slice(1)},${extra}}`);
}

function scanIn(bytes: Buffer, cuts: number[]): { scanner: CodecScanner; location: CodecLocation | null } {
  const scanner = new CodecScanner();
  let from = 0;
  for (const cut of [...cuts, bytes.length]) {
    scanner.push(bytes.subarray(from, cut));
    from = cut;
  }
  scanner.end();
  return { scanner, location: scanner.codec() };
}

/**
 * The located tensor as a harvest decodes it: the scanner hands the base64 text to a sink as the
 * chunks (cut at `cuts`) arrive, a Base64Decoder writes it into `dest` at an offset, then zstd when
 * compressed. Checks the text the sink got lies exactly where `location` says.
 */
function decoded(bytes: Buffer, location: CodecLocation, cuts: number[] = []): Buffer {
  const dest = Buffer.alloc(location.byteLength + 3, 0xee);
  const tensor = dest.subarray(2, 2 + location.byteLength);
  const text = location.compression === null ? tensor : Buffer.alloc(location.dataEnd - location.dataStart);
  const decoder = new Base64Decoder(text);
  let pieces = 0;
  const scanner = new CodecScanner(undefined, { start: () => decoder.reset(), text: (piece) => ((pieces += piece.length), decoder.write(piece)) });
  let from = 0;
  for (const cut of [...cuts, bytes.length]) {
    scanner.push(bytes.subarray(from, cut));
    from = cut;
  }
  scanner.end();
  assert.is(pieces, location.dataEnd - location.dataStart);
  const written = decoder.end();
  if (location.compression === null) assert.is(written, location.byteLength);
  else assert.is(zstdDecompressInto(text.subarray(0, written), tensor), location.byteLength);
  assert.is(dest[0], 0xee);
  assert.is(dest[dest.length - 1], 0xee);
  return tensor;
}

const values = Array.from({ length: 2 * 3 * 4 }, (_, i) => (i - 11) / 4);
const bf16 = encodeTensor(values, [2, 3, 4], 'bfloat16');
const rawBf16 = Buffer.from(bf16.data, 'base64');

test('finds the residual stream among decoys, at every split point, and decodes it exactly', () => {
  const bytes = body(bf16);
  assert.ok(JSON.parse(bytes.toString('utf8')), 'the fixture is valid JSON');
  const dataStart = bytes.indexOf(`"data":"${bf16.data}`) + 8;
  for (let cut = 0; cut <= bytes.length; cut++) {
    const { location } = scanIn(bytes, [cut]);
    assert.ok(location, `cut ${cut}`);
    assert.equal(location!.shape, [2, 3, 4], `cut ${cut}`);
    assert.is(location!.dtype, 'int16');
    assert.is(location!.originalDtype, 'torch.bfloat16');
    assert.is(location!.compression, null);
    assert.is(location!.byteLength, 48);
    assert.is(location!.dataStart, dataStart, `cut ${cut}`);
    assert.is(location!.dataEnd, dataStart + bf16.data.length);
  }
  // Decoding across chunk boundaries that split base64 quads anywhere.
  const { location } = scanIn(bytes, []);
  for (let cut = dataStart - 2; cut <= dataStart + bf16.data.length + 2; cut++) {
    assert.equal(decoded(bytes, location!, [cut]), rawBf16, `cut ${cut}`);
    assert.equal(decoded(bytes, location!, [cut, Math.min(bytes.length, cut + 3)]), rawBf16, `cuts ${cut}, +3`);
  }
});

test('byte-at-a-time and odd chunk sizes read the same envelope', () => {
  const bytes = body(bf16);
  const reference = scanIn(bytes, []).location;
  for (const size of [1, 2, 3, 5, 7, 13, 64]) {
    const cuts: number[] = [];
    for (let c = size; c < bytes.length; c += size) cuts.push(c);
    const { location } = scanIn(bytes, cuts);
    assert.equal(location, reference, `chunks of ${size}`);
    assert.equal(decoded(bytes, location!, cuts), rawBf16, `chunks of ${size}`);
  }
});

test('an envelope before the rest of the body is closed (and known) before the body ends', () => {
  const bytes = body(bf16, { before: false });
  const scanner = new CodecScanner();
  const closeAt = bytes.indexOf('},"qk_layers"') + 1;
  scanner.push(bytes.subarray(0, closeAt));
  assert.ok(scanner.codecClosed);
  assert.not.ok(scanner.complete);
  assert.is(scanner.codec()!.byteLength, 48);
  scanner.push(bytes.subarray(closeAt));
  scanner.end();
  assert.ok(scanner.complete);
});

test('zstd envelopes: the frame header is checked against the shape, and decodes into the destination', async () => {
  const packed = await encodeTensorZstd(values, [2, 3, 4], 'float32');
  const bytes = body(packed);
  const raw = Buffer.alloc(96);
  values.forEach((v, i) => raw.writeFloatLE(v, i * 4));
  for (let cut = 0; cut <= bytes.length; cut += 7) {
    const { location } = scanIn(bytes, [cut]);
    assert.is(location!.compression, 'zstd');
    assert.is(location!.byteLength, 96);
    assert.equal(decoded(bytes, location!, [cut]), raw);
  }
  const wrongShape = { ...packed, shape: [2, 3, 5] };
  assert.throws(() => scanIn(body(wrongShape), []), /zstd frame holds 96 bytes/);
  const notZstd = { ...bf16, compression: 'zstd' };
  assert.throws(() => scanIn(body(notZstd), []), /not a zstd frame/);
});

test('no envelope: codec() is null (absent, null, or not an object)', () => {
  assert.is(scanIn(Buffer.from('{"id":"x","choices":[]}'), []).location, null);
  assert.is(scanIn(Buffer.from('{"activations":{"residual_stream":null}}'), []).location, null);
  assert.is(scanIn(Buffer.from('{"activations":{"residual_stream":[1,2]}}'), []).location, null);
  assert.is(scanIn(Buffer.from('{"activations":null}'), []).location, null);
  assert.is(scanIn(Buffer.from('[{"activations":{"residual_stream":{"shape":[1]}}}]'), []).location, null, 'only at the top level');
});

test('the leading dimension is readable even when the envelope is otherwise malformed', () => {
  const scanner = new CodecScanner();
  scanner.push(Buffer.from('{"activations":{"residual_stream":{"data":"AAA","shape":[3,4]}}}'));
  scanner.end();
  assert.is(scanner.leadingDimension, 3);
  assert.throws(() => scanner.codec(), (e: unknown) => e instanceof CodecError);
});

const malformedBodies: Array<[string, string, RegExp]> = [
  ['truncated inside data', '{"activations":{"residual_stream":{"data":"AAAA', /ended at byte/],
  ['truncated after the envelope', '{"activations":{"residual_stream":{"data":"AAAA","dtype":"int8","shape":[3]}}', /ended at byte/],
  ['a bare word', '{"activations":{"residual_stream":{"data":"AAAA","dtype":int16,"shape":[3]}}}', /not valid JSON at byte 57/],
  ['a trailing comma', '{"a":[1,2,],"b":1}', /not valid JSON/],
  ['a missing colon', '{"a" 1}', /expected ':'/],
  ['a bad escape', '{"a":"\\x"}', /invalid escape/],
  ['a bad number', '{"a":1.}', /invalid number/],
  ['bytes after the value', '{"a":1} {', /after the JSON value/],
  ['a mismatched bracket', '{"a":[1}', /not valid JSON/],
];

test('malformed JSON throws CodecError wherever the body is cut', () => {
  for (const [what, text, message] of malformedBodies) {
    const bytes = Buffer.from(text);
    for (let cut = 0; cut <= bytes.length; cut++) {
      assert.throws(() => scanIn(bytes, [cut]), (e: unknown) => e instanceof CodecError && message.test((e as Error).message), `${what}, cut ${cut}`);
    }
  }
});

const malformedEnvelopes: Array<[string, object, RegExp]> = [
  ['no shape', { data: 'AAAA', dtype: 'int8' }, /no shape/],
  ['a string shape', { data: 'AAAA', dtype: 'int8', shape: '3' }, /shape is not/],
  ['a negative dimension', { data: 'AAAA', dtype: 'int8', shape: [-3] }, /shape is not/],
  ['a fractional dimension', { data: 'AAAA', dtype: 'int8', shape: [1.5] }, /shape is not/],
  ['a nested shape', { data: 'AAAA', dtype: 'int8', shape: [[3]] }, /shape is not/],
  ['an unknown dtype', { data: 'AAAA', dtype: 'bfloat16', shape: [3] }, /dtype "bfloat16" is not/],
  ['a missing dtype', { data: 'AAAA', shape: [3] }, /dtype \(missing/],
  ['a numeric dtype', { data: 'AAAA', dtype: 2, shape: [3] }, /dtype \(missing or not a string\)/],
  ['gzip', { data: 'AAAA', dtype: 'int8', shape: [3], compression: 'gzip' }, /compression "gzip"/],
  ['no data', { dtype: 'int8', shape: [3] }, /data is not a base64 string/],
  ['numeric data', { data: 7, dtype: 'int8', shape: [3] }, /data is not a base64 string/],
  ['escaped data', { data: 'AA\nA', dtype: 'int8', shape: [3] }, /data is not a base64 string/],
  ['short data', { data: 'AAAA', dtype: 'int16', shape: [3] }, /holds 4 base64 characters; shape \[3\] of int16 needs 8/],
  ['unpadded data', { data: 'AAAAA', dtype: 'int8', shape: [3] }, /not padded base64/],
];

test('malformed envelopes throw CodecError naming what is wrong', () => {
  for (const [what, codec, message] of malformedEnvelopes) {
    assert.throws(() => scanIn(body(codec), []), (e: unknown) => e instanceof CodecError && message.test((e as Error).message), what);
  }
  // Small fields escaped or too long are not what the reader looks for: reported, never misread.
  assert.throws(() => scanIn(Buffer.from('{"activations":{"residual_stream":{"data":"AAAA","dtype":"int\\u0038","shape":[3]}}}'), []), /dtype \(missing or not a string\)/);
  assert.throws(() => scanIn(body({ data: 'AAAA', dtype: 'x'.repeat(300), shape: [3] }), []), /dtype \(missing or not a string\)/);
});

test('the last envelope wins, as with JSON.parse', () => {
  const bytes = Buffer.from(`{"activations":{"residual_stream":{"data":"AAAA","dtype":"int8","shape":[3]},"residual_stream":{"data":"AAAAAAAA","dtype":"int16","shape":[3]}}}`);
  const { location } = scanIn(bytes, []);
  assert.is(location!.dtype, 'int16');
  assert.is(location!.dataEnd - location!.dataStart, 8);
});

test('Base64Decoder: any piece sizes, strict about characters, padding and room', () => {
  const raw = Buffer.from(Array.from({ length: 100 }, (_, i) => (i * 37) & 0xff));
  const text = Buffer.from(raw.toString('base64'));
  for (const size of [1, 2, 3, 4, 5, 9, 100, 1000]) {
    const dest = Buffer.alloc(100);
    const decoder = new Base64Decoder(dest);
    for (let i = 0; i < text.length; i += size) decoder.write(text.subarray(i, i + size));
    assert.is(decoder.end(), 100);
    assert.equal(dest, raw, `pieces of ${size}`);
  }
  const fails = (input: string, room: number, message: RegExp) => {
    const decoder = new Base64Decoder(Buffer.alloc(room));
    assert.throws(() => {
      decoder.write(Buffer.from(input));
      decoder.end();
    }, (e: unknown) => e instanceof CodecError && message.test((e as Error).message), input);
  };
  fails('AA*A', 3, /not padded standard base64/);
  fails('AA==AAAA', 6, /not padded standard base64/);
  fails('AAAAAAAA', 3, /more bytes than the destination/);
  fails('AAAAA', 6, /multiple of 4/);
  const decoder = new Base64Decoder(Buffer.alloc(8));
  decoder.write(Buffer.from('AA=='));
  assert.throws(() => decoder.write(Buffer.from('AAAA')), /after its padding/);
});

test.run();
