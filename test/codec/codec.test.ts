import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { decodeTensor, encodeTensor, encodeTensorZstd, bf16BitsToF32, f32ToBf16Bits, f16BitsToF32, f32ToF16Bits, CodecError } from '../../src/codec/index.ts';

test('ENGINE.md worked example, exactly', () => {
  const wire = { data: 'AACAPwAAAMAAAAA/AACAPg==', dtype: 'float32', shape: [1, 4] };
  assert.equal(Array.from(decodeTensor(wire).values), [1, -2, 0.5, 0.25]);
  assert.equal(decodeTensor(wire).shape, [1, 4]);
  const enc = encodeTensor([1, -2, 0.5, 0.25], [1, 4], 'float32');
  assert.is(enc.data, 'AACAPwAAAMAAAAA/AACAPg==');
  assert.is(enc.dtype, 'float32');
  assert.is(enc.original_dtype, 'torch.float32');
});

test('bf16: high half on decode, round to nearest even on encode', () => {
  assert.is(bf16BitsToF32(0x3f80), 1);
  assert.is(bf16BitsToF32(0xc000), -2);
  assert.is(f32ToBf16Bits(1), 0x3f80);
  // 1 + 2^-8 is exactly halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  assert.is(f32ToBf16Bits(1 + 2 ** -8), 0x3f80);
  // 1.0078125 + 2^-8 is halfway between 0x3f81 and 0x3f82: ties to even (0x3f82).
  assert.is(f32ToBf16Bits(1 + 2 ** -7 + 2 ** -8), 0x3f82);
  assert.is(f32ToBf16Bits(1 + 2 ** -8 + 2 ** -12), 0x3f81);
  assert.ok(Number.isNaN(bf16BitsToF32(f32ToBf16Bits(NaN))));
  assert.is(bf16BitsToF32(f32ToBf16Bits(-Infinity)), -Infinity);
  const enc = encodeTensor([1, -2, 0.5, 3.140625], [2, 2], 'bfloat16');
  assert.is(enc.dtype, 'int16');
  assert.is(enc.original_dtype, 'torch.bfloat16');
  assert.equal(Array.from(decodeTensor(enc).values), [1, -2, 0.5, 3.140625]);
});

test('float16 and int16 round trips', () => {
  for (const x of [0, 1, -2, 0.5, 65504, 6.103515625e-5, 5.960464477539063e-8, -0.333251953125]) assert.is(f16BitsToF32(f32ToF16Bits(x)), x);
  assert.is(f32ToF16Bits(1e6), 0x7c00);
  assert.is(f16BitsToF32(f32ToF16Bits(1 + 2 ** -11)), 1);
  assert.equal(Array.from(decodeTensor(encodeTensor([1, -2, 0.25], [3], 'float16')).values), [1, -2, 0.25]);
  assert.equal(Array.from(decodeTensor(encodeTensor([7, -300, 0], [3], 'int16')).values), [7, -300, 0]);
});

test('zstd payloads decode; missing compression means none', async () => {
  const values = Array.from({ length: 64 }, (_, i) => Math.sin(i));
  const packed = await encodeTensorZstd(values, [2, 32], 'float32');
  assert.is(packed.compression, 'zstd');
  const out = decodeTensor(packed);
  assert.equal(out.shape, [2, 32]);
  values.forEach((v, i) => assert.is(out.values[i], Math.fround(v)));
  const bf = decodeTensor(await encodeTensorZstd([1, 2, 3, 4], [1, 4], 'bfloat16'));
  assert.equal(Array.from(bf.values), [1, 2, 3, 4]);
});

test('malformed envelopes are CodecErrors', () => {
  const bad = [
    { data: 'AACAPw==', dtype: 'float32', shape: [2] },
    { data: 'AACAPw==', dtype: 'float64', shape: [1] },
    { data: 'AACAPw', dtype: 'float32', shape: [1] },
    { data: 'AACAPw==', dtype: 'float32', shape: [1], compression: 'gzip' },
    { data: 'AACAPw==', dtype: 'float32', shape: [1], compression: 'zstd' },
    { data: 'AACAPw==', dtype: 'float32', shape: [-1] },
    { data: 'AACAPw==', dtype: 'float32', original_dtype: 'torch.bfloat16', shape: [1] },
  ];
  for (const t of bad) assert.throws(() => decodeTensor(t), (e: unknown) => e instanceof CodecError, JSON.stringify(t));
});

test.run();
