import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Buffer } from 'node:buffer';
import { encodeSafetensorsHeader, headerRoom, layoutTensors, SafetensorsError, type TensorSpec } from '../../src/harvest/safetensors.ts';

// Read the way any safetensors reader does, written here from the format's description (not the module's code).
function readHeader(bytes: Buffer): { length: number; json: string; header: Record<string, any> } {
  const length = Number(bytes.readBigUInt64LE(0));
  const json = bytes.subarray(8, 8 + length).toString('utf8');
  return { length, json, header: JSON.parse(json) };
}

const metadata = { job_id: 'hj_abc', checkpoint: 'org/model-1b', layers: JSON.stringify([0, 5, 15]) };
const specs: TensorSpec[] = [
  { name: 'prompt_10', dtype: 'BF16', shape: [3, 4, 8], byteLength: 3 * 4 * 8 * 2 },
  { name: 'tokens_10', dtype: 'I32', shape: [4], byteLength: 16 },
  { name: 'prompt_11', dtype: 'BF16', shape: [3, 0, 8], byteLength: 0 },
  { name: 'tokens_11', dtype: 'I32', shape: [0], byteLength: 0 },
  { name: 'prompt_12', dtype: 'BF16', shape: [3, 1, 8], byteLength: 48 },
  { name: 'tokens_12', dtype: 'I32', shape: [1], byteLength: 4 },
];

test('the header: 8-byte LE length, JSON padded with spaces to a multiple of 8, string metadata, contiguous offsets in order', () => {
  const { tensors, dataBytes } = layoutTensors(specs);
  assert.is(dataBytes, 192 + 16 + 48 + 4);
  const bytes = encodeSafetensorsHeader(tensors, metadata);
  const { length, json, header } = readHeader(bytes);
  assert.is(bytes.length, 8 + length);
  assert.is(length % 8, 0);
  assert.ok(/^\{.*\} {0,7}$/s.test(json), 'JSON then at most 7 spaces');
  assert.equal(header.__metadata__, metadata);
  assert.equal(Object.keys(header), ['__metadata__', ...specs.map((s) => s.name)], 'tensors in data order');
  let at = 0;
  for (const spec of specs) {
    const entry = header[spec.name];
    assert.equal(entry, { dtype: spec.dtype, shape: spec.shape, data_offsets: [at, at + spec.byteLength] });
    at += spec.byteLength;
  }
  assert.is(at, dataBytes);
});

test('reserved room: the header is padded to exactly the room, which holds the widest numbers', () => {
  const names = specs.map((s) => ({ name: s.name, dtype: s.dtype, rank: s.shape.length }));
  const room = headerRoom(names, metadata);
  assert.is(room % 8, 0);
  const { tensors } = layoutTensors(specs);
  const padded = encodeSafetensorsHeader(tensors, metadata, room);
  assert.is(padded.length, room);
  assert.equal(readHeader(padded).header, readHeader(encodeSafetensorsHeader(tensors, metadata)).header);
  assert.ok(/^ +$/.test(padded.subarray(8 + readHeader(encodeSafetensorsHeader(tensors, metadata)).json.trimEnd().length).toString('latin1')), 'spaces after the JSON');
  // Tensors as large as a safe integer allows still fit the room.
  const huge = 2 ** 52;
  const widest = [
    { name: 'prompt_10', dtype: 'BF16' as const, shape: [1, 1, huge / 2], byteLength: huge },
    { name: 'tokens_10', dtype: 'I32' as const, shape: [huge / 4], byteLength: huge },
  ];
  const wideRoom = headerRoom(widest.map((s) => ({ name: s.name, dtype: s.dtype, rank: s.shape.length })), metadata);
  assert.is(encodeSafetensorsHeader(layoutTensors(widest).tensors, metadata, wideRoom).length, wideRoom);
  assert.throws(() => encodeSafetensorsHeader(tensors, metadata, 16), (e: Error) => e instanceof SafetensorsError && /reserved/.test(e.message));
  assert.throws(() => encodeSafetensorsHeader(tensors, metadata, room + 4), /multiple of 8/);
});

test('refused: a size that is not dtype × shape, gaps or overlaps, reserved or odd names, non-string metadata', () => {
  assert.throws(() => layoutTensors([{ name: 'prompt_0', dtype: 'BF16', shape: [2, 2], byteLength: 4 }]), /holds 8 bytes, not 4/);
  assert.throws(() => layoutTensors([{ name: 'prompt_0', dtype: 'BF16', shape: [2, -1], byteLength: 0 }]), /non-negative/);
  assert.throws(() => layoutTensors([{ name: '__metadata__', dtype: 'I32', shape: [1], byteLength: 4 }]), /not allowed/);
  assert.throws(() => layoutTensors([{ name: 'a"b', dtype: 'I32', shape: [1], byteLength: 4 }]), /not allowed/);
  const { tensors } = layoutTensors(specs.slice(0, 2));
  assert.throws(() => encodeSafetensorsHeader([tensors[0], { ...tensors[1], begin: tensors[1].begin + 2, end: tensors[1].end + 2 }], metadata), /layout needs/);
  assert.throws(() => encodeSafetensorsHeader([tensors[1], tensors[0]], metadata), /layout needs/);
  assert.throws(() => encodeSafetensorsHeader(tensors, { layers: [1, 2] as unknown as string }), /must be a string/);
});

test.run();
