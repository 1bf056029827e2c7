/**
 * zstd in the tensor codec: a frame may never expand past the tensor its envelope announces. A frame
 * that declares another content size is refused from its header, before anything is decoded; one that
 * declares none is decoded into exactly the tensor's bytes and refused when it has more. Frames are
 * built by hand (RFC 8878: RLE blocks) so that the sizes they declare and hold are exactly known.
 */
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Buffer } from 'node:buffer';
import { CodecError, CodecScanner, decodeTensor, encodeTensor, encodeTensorZstdSync, zstdDecompressInto } from '../../src/codec/index.ts';
import { decodeCapture } from '../../src/harvest/capture-decode.ts';

const MAGIC = [0x28, 0xb5, 0x2f, 0xfd];
/** RLE blocks of `byte`, `sizes` long each (at most 128 KiB each), the last one marked last. */
const rleBlocks = (byte: number, sizes: number[]) =>
  sizes.flatMap((size, i) => {
    const header = (i === sizes.length - 1 ? 1 : 0) | (1 << 1) | (size << 3);
    return [header & 0xff, (header >>> 8) & 0xff, (header >>> 16) & 0xff, byte];
  });
/** A frame that records no content size (window 128 KiB). */
const undeclared = (sizes: number[], byte = 0x3f) => Uint8Array.from([...MAGIC, 0x00, 0x38, ...rleBlocks(byte, sizes)]);
/** A frame that declares `declared` bytes (8-byte Frame_Content_Size) and holds `sizes` of RLE blocks. */
function declaring(declared: bigint, sizes: number[]): Uint8Array {
  const fcs = Buffer.alloc(8);
  fcs.writeBigUInt64LE(declared);
  return Uint8Array.from([...MAGIC, 0xc0, 0x38, ...fcs, ...rleBlocks(0x3f, sizes)]);
}
const envelope = (frame: Uint8Array, shape: number[], dtype = 'float32') => ({ data: Buffer.from(frame).toString('base64'), dtype, shape, compression: 'zstd' });

test('a frame without a content size decodes into exactly the tensor, and one that holds more is refused', () => {
  const fits = decodeTensor(envelope(undeclared([4096]), [1024]));
  assert.is(fits.values.length, 1024);
  assert.is(fits.values[0], new Float32Array(Uint8Array.from([0x3f, 0x3f, 0x3f, 0x3f]).buffer)[0]);
  // 64 MiB of RLE in a 40-byte frame for a 4 KiB tensor: refused by the decoder's bound
  const bomb = undeclared(Array.from({ length: 512 }, () => 128 * 1024));
  assert.throws(() => decodeTensor(envelope(bomb, [1024])), (err: Error) => err instanceof CodecError && /4096 bytes/.test(err.message));
  assert.throws(() => zstdDecompressInto(bomb, new Uint8Array(4096)), (err: Error) => err instanceof CodecError);
  const short = undeclared([100]);
  assert.throws(() => decodeTensor(envelope(short, [1024])), /holds 100 bytes; the tensor needs 4096|4096 bytes/);
});

test('a frame that declares more than the shape is refused from its header, even a terabyte', () => {
  const huge = declaring(2n ** 40n, [128]);
  assert.throws(() => decodeTensor(envelope(huge, [32])), /declares 1099511627776 bytes; the tensor needs 128/);
  assert.throws(() => zstdDecompressInto(huge, new Uint8Array(128)), /declares 1099511627776 bytes/);
  // the same frame declaring its true size decodes
  assert.is(decodeTensor(envelope(declaring(128n, [128]), [32])).values.length, 32);
});

test('a capture whose undeclared frame expands past its shape is refused, on the harvest and the reader paths', () => {
  const shape = [2, 4, 8]; // bf16: 128 bytes
  const frame = undeclared([128, 128 * 1024]);
  const body = Buffer.from(`{"activations":{"residual_stream":${JSON.stringify({ ...envelope(frame, shape, 'int16'), original_dtype: 'torch.bfloat16' })}}}`);
  assert.throws(() => decodeCapture(body, { layers: 2, dModel: 8 }), (err: Error) => err instanceof CodecError);
  const scanner = new CodecScanner();
  scanner.push(body);
  scanner.end();
  const location = scanner.codec()!;
  const located = Buffer.from(body.subarray(location.dataStart, location.dataEnd).toString('latin1'), 'base64');
  assert.throws(() => zstdDecompressInto(located, new Uint8Array(location.byteLength)), (err: Error) => err instanceof CodecError);
});

test('a level-1 frame of the encoder decodes to the uncompressed tensor, on both paths', () => {
  const values = Array.from({ length: 3 * 5 * 16 }, (_, i) => Math.sin(i) * 40);
  const packed = encodeTensorZstdSync(values, [3, 5, 16], 'bfloat16');
  const plain = encodeTensor(values, [3, 5, 16], 'bfloat16');
  assert.is(packed.compression, 'zstd');
  assert.equal([...decodeTensor(packed).values], [...decodeTensor(plain).values]);
  const body = (t: object) => Buffer.from(`{"activations":{"residual_stream":${JSON.stringify(t)}}}`);
  assert.ok(decodeCapture(body(packed), { layers: 3, dModel: 16 }).bytes.equals(Buffer.from(plain.data, 'base64')));
});

test.run();
