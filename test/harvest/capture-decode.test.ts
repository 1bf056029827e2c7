import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Buffer } from 'node:buffer';
import { CodecError, encodeTensor, encodeTensorZstd, f16BitsToF32, f32ToBf16Bits, type EncodedTensor } from '../../src/codec/index.ts';
import { CaptureBuffers, CaptureIncomplete, CaptureReader, decodeCapture } from '../../src/harvest/capture-decode.ts';
import { kernelMemoryOf } from '../../src/harvest/stats-memory.ts';

/** A vLLM + vllm-lens completion with a capture: the envelope last, its shape after its data, as vLLM writes it. */
function captureBody(codec: EncodedTensor | null, extra = ''): Buffer {
  const envelope = codec && `{"data":"${codec.data}","dtype":"${codec.dtype}","original_dtype":${JSON.stringify(codec.original_dtype ?? null)},"compression":${JSON.stringify(codec.compression ?? null)},"shape":${JSON.stringify(codec.shape)}}`;
  return Buffer.from(
    `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" the \\"data\\"","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}${extra}${envelope ? `,"activations":{"residual_stream":${envelope}}` : ''}}`,
  );
}

const shape = [2, 3, 4];
const values = Array.from({ length: 24 }, (_, i) => Math.sin(i + 1) * 10 ** ((i % 7) - 3));
const expect = { layers: 2, dModel: 4 };

function bf16Of(vals: number[]): Buffer {
  const out = Buffer.alloc(vals.length * 2);
  vals.forEach((v, i) => out.writeUInt16LE(f32ToBf16Bits(v), i * 2));
  return out;
}

test('bf16 passes through byte for byte, whole or in chunks split anywhere, zstd too', async () => {
  const bf16 = encodeTensor(values, shape, 'bfloat16');
  const raw = Buffer.from(bf16.data, 'base64');
  const body = captureBody(bf16);
  const whole = decodeCapture(body, expect);
  assert.equal(whole.shape, [2, 3, 4]);
  assert.equal(whole.bytes, raw);
  for (let cut = 1; cut < body.length; cut += 5) assert.equal(decodeCapture([body.subarray(0, cut), body.subarray(cut)], expect).bytes, raw, `cut ${cut}`);
  const packed = await encodeTensorZstd(values, shape, 'bfloat16');
  assert.equal(decodeCapture(captureBody(packed), expect).bytes, raw);
  assert.equal(decodeCapture(captureBody(bf16), { layers: 2, dModel: null }).shape, [2, 3, 4], 'an unknown width takes the capture’s');
});

test('float32 is rounded to bf16 to nearest even, as the codec does, ties and specials included', async () => {
  const specials = [0, -0, 1, -2.5, Infinity, -Infinity, NaN, 3.4028234663852886e38, -3.4028234663852886e38, 1e-45, -1e-40, 1.0000000596046448, 1.00390625, 1.01171875, 1.0039063692092896, 65504, 1 / 3];
  const vals = [...specials, ...values].slice(0, 24);
  const f32 = encodeTensor(vals, shape, 'float32');
  const expected = bf16Of(vals);
  assert.equal(decodeCapture(captureBody(f32), expect).bytes, expected);
  assert.equal(decodeCapture(captureBody(await encodeTensorZstd(vals, shape, 'float32')), expect).bytes, expected);
  const got = decodeCapture(captureBody(f32), expect).bytes;
  assert.is(got.readUInt16LE(12 * 2), 0x3f80, '1 + 2^-8 is a tie: down to even');
  assert.is(got.readUInt16LE(13 * 2), 0x3f82, '1 + 3·2^-8 is a tie: up to even');
  assert.is(got.readUInt16LE(14 * 2), 0x3f81, 'just above a tie: up');
  assert.is(got.readUInt16LE(6 * 2) & 0x7fc0, 0x7fc0, 'NaN stays a quiet NaN');
});

test('float16: every one of the 65,536 halves becomes the bf16 nearest to its value', () => {
  const halves = Buffer.alloc(65536 * 2);
  for (let h = 0; h < 65536; h++) halves.writeUInt16LE(h, h * 2);
  const codec = { data: halves.toString('base64'), dtype: 'float16', original_dtype: 'torch.float16', shape: [4, 8, 2048] };
  const { bytes } = decodeCapture(captureBody(codec), { layers: 4, dModel: 2048 });
  for (let h = 0; h < 65536; h++) {
    const want = f32ToBf16Bits(f16BitsToF32(h));
    const got = bytes.readUInt16LE(h * 2);
    if (Number.isNaN(f16BitsToF32(h))) assert.ok((got & 0x7f80) === 0x7f80 && (got & 0x7f) !== 0, `half ${h} is NaN`);
    else if (got !== want) assert.unreachable(`half 0x${h.toString(16)}: 0x${got.toString(16)}, expected 0x${want.toString(16)}`);
  }
});

test('fewer layers than asked, or no capture at all, is CaptureIncomplete', () => {
  const bf16 = encodeTensor(values, shape, 'bfloat16');
  assert.throws(() => decodeCapture(captureBody(bf16), { layers: 3, dModel: 4 }), (e: Error) => e instanceof CaptureIncomplete && (e as CaptureIncomplete).code === 'capture_incomplete' && /2 of 3/.test(e.message));
  assert.throws(() => decodeCapture(captureBody(null), expect), (e: Error) => e instanceof CaptureIncomplete);
});

test('a malformed body or an envelope that is not a capture is a CodecError', () => {
  const bf16 = encodeTensor(values, shape, 'bfloat16');
  const codecError = (re: RegExp) => (e: Error) => e instanceof CodecError && re.test(e.message);
  assert.throws(() => decodeCapture(captureBody(bf16), { layers: 1, dModel: 4 }), codecError(/2 layers; 1 were requested/));
  assert.throws(() => decodeCapture(captureBody(bf16), { layers: 2, dModel: 8 }), codecError(/4 wide/));
  assert.throws(() => decodeCapture(captureBody(encodeTensor(values, [6, 4], 'bfloat16')), { layers: 6, dModel: 4 }), codecError(/\[layers, tokens, d_model\]/));
  assert.throws(() => decodeCapture(captureBody(encodeTensor(values, shape, 'int16')), expect), codecError(/int16 \(torch.int16\)/));
  assert.throws(() => decodeCapture(captureBody({ ...bf16, data: bf16.data.slice(4) }), expect), codecError(/base64 characters/));
  const body = captureBody(bf16);
  assert.throws(() => decodeCapture(body.subarray(0, body.length - 1), expect), codecError(/ended/));
});

test('CaptureBuffers: with a phase, a buffer starts that far past a 4 KiB boundary of kernel memory, and is taken again once given back', () => {
  const buffers = new CaptureBuffers({ minBytes: 0, keep: 4 });
  const body = captureBody(encodeTensor(values, shape, 'bfloat16'));
  const plain = decodeCapture(body, expect, buffers);
  for (const offset of [0, 8, 2048 + 4, 4096 * 3 + 1000, 123_456]) {
    const placed = decodeCapture(body, expect, buffers, offset);
    assert.is(placed.bytes.byteOffset % 4096, offset % 4096, `offset ${offset}`);
    assert.equal(placed.bytes, plain.bytes, `offset ${offset}: the same bytes`);
    buffers.give(placed.bytes);
    const again = buffers.take(placed.bytes.byteLength, offset);
    assert.ok(again.buffer === placed.bytes.buffer && again.byteOffset === placed.bytes.byteOffset, `offset ${offset}: the same memory again`);
    buffers.give(again);
  }
  const odd = decodeCapture(body, expect, buffers, 4096 + 6);
  assert.is(odd.bytes.byteOffset % 64, 0, 'a phase that is not a multiple of 4 is ignored');
  assert.equal(odd.bytes, plain.bytes);
});

test('CaptureBuffers: a buffer given back is taken again (the float32 path’s scratch too); foreign or small ones are not kept', () => {
  const buffers = new CaptureBuffers({ minBytes: 0, keep: 2 });
  const bf16 = captureBody(encodeTensor(values, shape, 'bfloat16'));
  const first = decodeCapture(bf16, expect, buffers);
  assert.is(buffers.made, 1);
  buffers.give(first.bytes);
  const second = decodeCapture(bf16, expect, buffers);
  assert.ok(second.bytes.buffer === first.bytes.buffer && second.bytes.byteOffset === first.bytes.byteOffset, 'the same memory again');
  assert.equal(second.bytes, Buffer.from(encodeTensor(values, shape, 'bfloat16').data, 'base64'));
  const f32 = decodeCapture(captureBody(encodeTensor(values, shape, 'float32')), expect, buffers);
  assert.is(buffers.made, 3, 'an output and a scratch buffer');
  assert.equal(f32.bytes, bf16Of(values));
  decodeCapture(captureBody(encodeTensor(values, shape, 'float32')), expect, buffers);
  assert.is(buffers.made, 4, 'the scratch buffer was given back and taken again');
  buffers.give(Buffer.alloc(100));
  assert.throws(() => decodeCapture(captureBody(encodeTensor(values, [2, 3, 4], 'bfloat16')), { layers: 5, dModel: 4 }, buffers));
  const unpooled = new CaptureBuffers();
  const small = decodeCapture(bf16, expect, unpooled);
  unpooled.give(small.bytes);
  decodeCapture(bf16, expect, unpooled);
  assert.is(unpooled.made, 2, 'buffers under minBytes are left to the allocator');
});

test('the tensor is never parsed as JSON: JSON.parse is not called', () => {
  const body = captureBody(encodeTensor(values, shape, 'float32'));
  const parse = JSON.parse;
  JSON.parse = () => {
    throw new Error('JSON.parse was called');
  };
  try {
    assert.is(decodeCapture(body, expect).bytes.length, 48);
  } finally {
    JSON.parse = parse;
  }
});

test('CaptureReader: decoded as chunks arrive, whatever the body length said (none, too small, exact), into buffers given back on a refusal', () => {
  const big = [2, 300, 2048]; // 2.4 MB of bf16: past the 1 MiB a body of unknown length starts with
  const vals = Array.from({ length: 2 * 300 * 2048 }, (_, i) => Math.cos(i) * 3);
  const codec = encodeTensor(vals, big, 'bfloat16');
  const body = captureBody(codec);
  const raw = Buffer.from(codec.data, 'base64');
  for (const length of [null, 1000, body.length]) {
    const buffers = new CaptureBuffers({ minBytes: 0 });
    const reader = new CaptureReader({ layers: 2, dModel: 2048 }, buffers, length);
    for (let at = 0, step = 1; at < body.length; at += step, step = (step * 7 + 13) % 70_001) reader.push(body.subarray(at, at + step));
    const { shape, bytes } = reader.end();
    assert.equal(shape, [2, 300, 2048]);
    assert.ok(bytes.equals(raw), `body length ${length}`);
    if (length === body.length) assert.is(buffers.made, 1, 'an exact length takes one buffer');
    else assert.ok(buffers.made > 1, 'a length unknown or too small grows the buffer');
  }
  // A refused body gives its buffer back: the next capture takes it again.
  const buffers = new CaptureBuffers({ minBytes: 0 });
  const refused = new CaptureReader({ layers: 3, dModel: 2048 }, buffers, body.length);
  refused.push(body);
  assert.throws(() => refused.end(), (e: Error) => e instanceof CaptureIncomplete);
  const next = new CaptureReader({ layers: 2, dModel: 2048 }, buffers, body.length);
  next.push(body);
  assert.ok(next.end().bytes.equals(raw));
  assert.is(buffers.made, 1, 'the refused capture’s buffer was taken again');
});

test('float32 rounded in kernel memory, in place or a piece at a time, to the bits of the scalar rounding (every NaN kept a NaN)', () => {
  const count = 2 * 3 * 11_001; // past the 65,536 words of a piece, not a multiple of 8
  const words = new Uint32Array(count);
  let s = 99;
  for (let i = 0; i < count; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    // random words (NaNs of every payload among them), ties, and values next to them
    words[i] = i % 5 === 0 ? (s & 0xffff0000) | 0x8000 : i % 5 === 1 ? (s & 0xffff0000) | 0x7fff : i % 97 === 0 ? 0x7f800001 + (s & 0x7fffff) : s;
  }
  const want = Buffer.alloc(count * 2);
  words.forEach((w, i) => want.writeUInt16LE((w & 0x7fffffff) > 0x7f800000 ? (w >>> 16) | 0x0040 : (w + 0x7fff + ((w >>> 16) & 1)) >>> 16, i * 2));
  const body = captureBody({ data: Buffer.from(words.buffer).toString('base64'), dtype: 'float32', original_dtype: 'torch.float32', shape: [2, 3, 11_001] });
  const buffers = new CaptureBuffers({ minBytes: 0 });
  const pooled = decodeCapture(body, { layers: 2, dModel: 11_001 }, buffers).bytes;
  assert.ok(kernelMemoryOf(pooled), 'decoded into kernel memory');
  assert.ok(pooled.equals(want), 'rounded in place');
  assert.ok(decodeCapture(body, { layers: 2, dModel: 11_001 }).bytes.equals(want), 'rounded a piece at a time');
});

test('after a float32 capture the next is rounded as its text decodes: the same bits, in chunks split anywhere; a bf16 or zstd one after it too', async () => {
  const big = [2, 40, 2051]; // 656 KB of float32: past a 64 KiB piece, words not a multiple of 8
  const vals = Array.from({ length: 2 * 40 * 2051 }, (_, i) => (i % 101 === 7 ? NaN : Math.sin(i) * 10 ** ((i % 9) - 4)));
  const f32 = captureBody(encodeTensor(vals, big, 'float32'));
  const want = bf16Of(vals);
  const buffers = new CaptureBuffers({ minBytes: 0 });
  const read = (body: Buffer, length: number | null) => {
    const reader = new CaptureReader({ layers: 2, dModel: 2051 }, buffers, length);
    for (let at = 0, step = 5; at < body.length; at += step, step = (step * 7 + 13) % 90_001) reader.push(body.subarray(at, at + step));
    return reader.end().bytes;
  };
  assert.ok(read(f32, f32.length).equals(want), 'the first, rounded at the end');
  assert.is(buffers.float32Last, true);
  for (let k = 0; k < 2; k++) {
    const bytes = read(f32, f32.length);
    assert.ok(bytes.equals(want), 'rounded as it decoded');
    assert.ok(kernelMemoryOf(bytes));
    buffers.give(bytes);
  }
  assert.ok(read(f32, null).equals(want), 'a body of unknown length');
  const bf16 = encodeTensor(vals, big, 'bfloat16');
  assert.ok(read(captureBody(bf16), null).equals(Buffer.from(bf16.data, 'base64')), 'a bf16 capture after float32 ones');
  assert.is(buffers.float32Last, false);
  read(f32, f32.length);
  assert.ok(read(captureBody(await encodeTensorZstd(vals, big, 'float32')), null).equals(want), 'zstd after float32');
});

test.run();
