// The tensor codec of ENGINE.md: {data, dtype, original_dtype, shape, compression}, little-endian row-major.
// This face holds the small-tensor encoder and decoder; the capture reader (reader.ts) finds a large
// envelope inside a response body without making a string of it, base64.ts decodes its text into place;
// wire.ts holds the codec's facts.
import { Buffer } from 'node:buffer';
import { zstdCompress, zstdDecompressInto } from './zstd.ts';
import { CodecError } from './errors.ts';
import { CODEC_DTYPE_SIZES, base64TextError } from './wire.ts';

export { CodecError } from './errors.ts';
export {
  CODEC_DTYPE_SIZES,
  BASE64_PATTERN,
  base64TextError,
  base64LengthError,
  base64DecodedLength,
  base64EncodedLength,
  base64Padding,
  tensorByteLength,
  zstdContentSize,
  zstdContentSizeOfBase64,
  walkZstdFrame,
  type CodecDtype,
  type ZstdFrameWalk,
} from './wire.ts';
export { CodecScanner, RESIDUAL_STREAM_PATH, type CodecLocation, type CodecDataSink } from './reader.ts';
export { Base64Decoder, type Base64Prefix } from './base64.ts';
export { zstdCompress, zstdDecompressInto } from './zstd.ts';

export type WireDtype = 'float32' | 'float16' | 'int16';
/** What the values mean; `bfloat16` travels as int16 bit patterns with original_dtype torch.bfloat16. */
export type TensorDtype = 'float32' | 'float16' | 'bfloat16' | 'int16';

export interface EncodedTensor {
  data: string;
  dtype: string;
  original_dtype?: string | null;
  shape: number[];
  compression?: string | null;
}

export interface DecodedTensor {
  shape: number[];
  values: Float32Array;
}

/** The dtypes this decoder widens to float32 (the codec may carry more: see CODEC_DTYPE_SIZES). */
const DECODABLE: ReadonlySet<string> = new Set<WireDtype>(['float32', 'float16', 'int16']);
/** Guards the decoder: a zstd frame must not expand beyond what the envelope's shape announces. */
const MAX_ELEMENTS = 1 << 28;

export function elementCount(shape: readonly number[]): number {
  let n = 1;
  for (const d of shape) n *= d;
  return n;
}

/** Decodes any supported envelope to float32 values (bf16 and float16 widened exactly). */
export function decodeTensor(t: EncodedTensor): DecodedTensor {
  if (t === null || typeof t !== 'object') throw new CodecError('tensor must be an object');
  if (typeof t.data !== 'string') throw new CodecError('tensor data must be a base64 string');
  if (!Array.isArray(t.shape) || !t.shape.every((d) => Number.isInteger(d) && d >= 0)) throw new CodecError('tensor shape must be a list of non-negative integers');
  const dtype = t.dtype as WireDtype;
  if (!DECODABLE.has(dtype)) throw new CodecError(`tensor dtype ${JSON.stringify(t.dtype)} is not supported (float32, float16, int16)`);
  const bf16 = t.original_dtype === 'torch.bfloat16';
  if (bf16 && dtype !== 'int16') throw new CodecError('original_dtype torch.bfloat16 travels with dtype int16');
  const count = elementCount(t.shape);
  if (count > MAX_ELEMENTS) throw new CodecError('tensor is too large');
  const base64Error = base64TextError(t.data);
  if (base64Error) throw new CodecError(`tensor data ${base64Error}`);
  let raw: Uint8Array = Buffer.from(t.data, 'base64');
  const compression = t.compression ?? null;
  const expected = count * CODEC_DTYPE_SIZES[dtype];
  if (compression === 'zstd') {
    // Bounded by the shape: a frame that declares or expands to more is refused, never allocated.
    const out = new Uint8Array(expected);
    zstdDecompressInto(raw, out);
    raw = out;
  } else if (compression !== null) {
    throw new CodecError(`tensor compression ${JSON.stringify(compression)} is not supported (zstd or none)`);
  }
  if (raw.byteLength !== expected) throw new CodecError(`tensor data holds ${raw.byteLength} bytes; shape ${JSON.stringify(t.shape)} of ${dtype} needs ${expected}`);
  const view = new DataView(raw.buffer, raw.byteOffset, raw.byteLength);
  const values = new Float32Array(count);
  if (dtype === 'float32') for (let i = 0; i < count; i++) values[i] = view.getFloat32(i * 4, true);
  else if (dtype === 'float16') for (let i = 0; i < count; i++) values[i] = f16BitsToF32(view.getUint16(i * 2, true));
  else if (bf16) for (let i = 0; i < count; i++) values[i] = bf16BitsToF32(view.getUint16(i * 2, true));
  else for (let i = 0; i < count; i++) values[i] = view.getInt16(i * 2, true);
  return { shape: t.shape.slice(), values };
}

/** Encodes float32 values as `dtype`; bfloat16 rounds to nearest even and travels as int16. Uncompressed. */
export function encodeTensor(values: ArrayLike<number>, shape: readonly number[], dtype: TensorDtype = 'float32'): EncodedTensor {
  const raw = encodeRaw(values, shape, dtype);
  return envelope(Buffer.from(raw.buffer, raw.byteOffset, raw.byteLength).toString('base64'), shape, dtype, null);
}

/** Same, compressed as one zstd frame at level 1 that records its content size (as vllm-lens sends captures). */
export function encodeTensorZstdSync(values: ArrayLike<number>, shape: readonly number[], dtype: TensorDtype = 'float32'): EncodedTensor {
  const packed = zstdCompress(encodeRaw(values, shape, dtype), 1);
  return envelope(Buffer.from(packed.buffer, packed.byteOffset, packed.byteLength).toString('base64'), shape, dtype, 'zstd');
}

/** encodeTensorZstdSync, as a promise (its callers predate the synchronous form). */
export async function encodeTensorZstd(values: ArrayLike<number>, shape: readonly number[], dtype: TensorDtype = 'float32'): Promise<EncodedTensor> {
  return encodeTensorZstdSync(values, shape, dtype);
}

function envelope(data: string, shape: readonly number[], dtype: TensorDtype, compression: 'zstd' | null): EncodedTensor {
  const wire: WireDtype = dtype === 'bfloat16' ? 'int16' : dtype;
  return { data, dtype: wire, original_dtype: `torch.${dtype}`, shape: shape.slice(), compression };
}

function encodeRaw(values: ArrayLike<number>, shape: readonly number[], dtype: TensorDtype): Uint8Array {
  const count = elementCount(shape);
  if (values.length !== count) throw new CodecError(`${values.length} values do not fill shape ${JSON.stringify(shape)}`);
  const size = CODEC_DTYPE_SIZES[dtype === 'bfloat16' ? 'int16' : dtype];
  const raw = new Uint8Array(count * size);
  const view = new DataView(raw.buffer);
  if (dtype === 'float32') for (let i = 0; i < count; i++) view.setFloat32(i * 4, values[i], true);
  else if (dtype === 'bfloat16') for (let i = 0; i < count; i++) view.setUint16(i * 2, f32ToBf16Bits(values[i]), true);
  else if (dtype === 'float16') for (let i = 0; i < count; i++) view.setUint16(i * 2, f32ToF16Bits(values[i]), true);
  else for (let i = 0; i < count; i++) view.setInt16(i * 2, values[i], true);
  return raw;
}

const f32 = new Float32Array(1);
const u32 = new Uint32Array(f32.buffer);

/** bf16 -> f32: the 16 bits become the high half of the float32 word. */
export function bf16BitsToF32(bits: number): number {
  u32[0] = (bits & 0xffff) << 16;
  return f32[0];
}

/** f32 -> bf16 with round-to-nearest-even; NaN stays a (quiet) NaN. */
export function f32ToBf16Bits(x: number): number {
  f32[0] = x;
  const w = u32[0];
  if ((w & 0x7fffffff) > 0x7f800000) return ((w >>> 16) | 0x0040) & 0xffff;
  return ((w + 0x7fff + ((w >>> 16) & 1)) >>> 16) & 0xffff;
}

export function f16BitsToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24;
  if (exp === 31) return frac ? NaN : sign * Infinity;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

/** f32 -> IEEE half with round-to-nearest-even (overflow to infinity). */
export function f32ToF16Bits(x: number): number {
  f32[0] = x;
  const w = u32[0];
  const sign = (w >>> 16) & 0x8000;
  const exp = (w >>> 23) & 0xff;
  let mant = w & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant ? 0x200 : 0);
  let e = exp - 127 + 15;
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    const half = 1 << (shift - 1);
    const rest = mant & ((1 << shift) - 1);
    let m = mant >>> shift;
    if (rest > half || (rest === half && (m & 1))) m++;
    return sign | m;
  }
  const rest = mant & 0x1fff;
  let m = mant >>> 13;
  if (rest > 0x1000 || (rest === 0x1000 && (m & 1))) {
    m++;
    if (m === 0x400) {
      m = 0;
      e++;
      if (e >= 31) return sign | 0x7c00;
    }
  }
  return sign | (e << 10) | m;
}
