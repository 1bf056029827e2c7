// Turns an engine's capture response into the bf16 bytes a shard stores, without JSON.parse of the
// tensor and without a string of it: the codec reader locates the envelope in the body's bytes and the
// bounded base64 decoder writes the tensor straight into the buffer the shard writes. bf16 passes through
// untouched; float32 and float16 captures are rounded to bf16 (nearest even) in one typed-array pass.
import { Buffer } from 'node:buffer';
import { endianness } from 'node:os';
import { CodecError, CodecScanner, decodeCodecInto, f16BitsToF32, f32ToBf16Bits, type CodecLocation } from '../codec/index.ts';

/** The capture holds fewer layers than were asked for (or none): the engine's answer is incomplete. */
export class CaptureIncomplete extends Error {
  override name = 'CaptureIncomplete';
  readonly code = 'capture_incomplete';
}

export interface CaptureExpectation {
  /** Layers asked for: the capture's first dimension must equal it. */
  layers: number;
  /** The model's width when known; null takes the capture's. */
  dModel: number | null;
}

/** One prompt's capture as a shard takes it: its token ids and its residual stream as bf16 bytes. */
export interface CapturedPrompt {
  tokens: Int32Array;
  shape: readonly [layers: number, tokens: number, dModel: number];
  bytes: Uint8Array;
}

export interface DecodedCapture {
  shape: [layers: number, tokens: number, dModel: number];
  /** The residual stream as bf16, little-endian, row-major: layers × tokens × dModel × 2 bytes. */
  bytes: Buffer;
}

// Typed arrays use the host's byte order; the codec and safetensors are little-endian.
const LITTLE_ENDIAN = endianness() === 'LE';

/**
 * Decodes the residual stream of a capture response (the body whole, or its chunks in order). A body
 * that is not JSON, or an envelope that is malformed, not a float tensor, not [layers, tokens, d_model]
 * or of another width throws `CodecError`; no envelope or fewer layers than expected throws `CaptureIncomplete`.
 */
export function decodeCapture(body: Uint8Array | readonly Uint8Array[], expect: CaptureExpectation): DecodedCapture {
  const chunks = body instanceof Uint8Array ? [body] : body;
  const scanner = new CodecScanner();
  for (const chunk of chunks) scanner.push(chunk);
  scanner.end();
  const location = scanner.codec();
  if (location === null) throw new CaptureIncomplete(`the capture returned no residual stream; ${expect.layers} layers were requested`);
  const [layers, tokens, dModel] = location.shape;
  if (location.shape.length !== 3) throw new CodecError(`the residual stream has shape [${location.shape.join(', ')}]; a capture is [layers, tokens, d_model]`);
  if (layers < expect.layers) throw new CaptureIncomplete(`the capture returned ${layers} of ${expect.layers} requested layers`);
  if (layers > expect.layers) throw new CodecError(`the capture returned ${layers} layers; ${expect.layers} were requested`);
  if (expect.dModel !== null && dModel !== expect.dModel) throw new CodecError(`the capture is ${dModel} wide; the model's d_model is ${expect.dModel}`);
  return { shape: [layers, tokens, dModel], bytes: decodeAsBf16(chunks, location) };
}

function decodeAsBf16(chunks: readonly Uint8Array[], location: CodecLocation): Buffer {
  const { dtype, originalDtype } = location;
  const count = location.byteLength / (dtype === 'float32' ? 4 : 2);
  // Not pooled: the buffer starts at offset 0 of its own memory, so typed-array views of it are aligned.
  const out = Buffer.allocUnsafeSlow(count * 2);
  if (dtype === 'int16' && originalDtype === 'torch.bfloat16') {
    decodeCodecInto(chunks, location, out);
    return out;
  }
  if (dtype !== 'float32' && dtype !== 'float16') {
    throw new CodecError(`the residual stream is ${dtype}${originalDtype ? ` (${originalDtype})` : ''}; a capture is bfloat16, float16 or float32`);
  }
  if (!LITTLE_ENDIAN) throw new CodecError('converting a capture to bf16 needs a little-endian host');
  const wide = Buffer.allocUnsafeSlow(location.byteLength);
  decodeCodecInto(chunks, location, wide);
  const bf16 = new Uint16Array(out.buffer, out.byteOffset, count);
  if (dtype === 'float32') f32ToBf16(new Uint32Array(wide.buffer, wide.byteOffset, count), bf16);
  else f16ToBf16(new Uint16Array(wide.buffer, wide.byteOffset, count), bf16);
  return out;
}

/** float32 words -> bf16, round to nearest even; a NaN stays a quiet NaN (as the codec's f32ToBf16Bits). */
function f32ToBf16(words: Uint32Array, out: Uint16Array): void {
  for (let i = 0; i < words.length; i++) {
    const w = words[i];
    out[i] = (w & 0x7fffffff) > 0x7f800000 ? (w >>> 16) | 0x0040 : (w + 0x7fff + ((w >>> 16) & 1)) >>> 16;
  }
}

let f16Table: Uint16Array | null = null;

/** float16 -> bf16 through a table of all 65,536 halves (each exact in float32, then rounded once). */
function f16ToBf16(halves: Uint16Array, out: Uint16Array): void {
  if (f16Table === null) {
    f16Table = new Uint16Array(65536);
    for (let h = 0; h < 65536; h++) f16Table[h] = f32ToBf16Bits(f16BitsToF32(h));
  }
  const table = f16Table;
  for (let i = 0; i < halves.length; i++) out[i] = table[halves[i]];
}
