// Facts of the tensor codec's wire form (ENGINE.md, "The tensor codec"), stated once: the numpy dtype
// names and their item sizes, what padded standard base64 is, and the zstd frame header. The steering
// validator, the tensor decoder and the capture reader all read them from here.
import { Buffer } from 'node:buffer';

/** numpy dtype names a codec envelope may carry, with their item sizes in bytes. */
export const CODEC_DTYPE_SIZES = {
  float16: 2,
  float32: 4,
  float64: 8,
  int8: 1,
  int16: 2,
  int32: 4,
  int64: 8,
  uint8: 1,
  uint16: 2,
  uint32: 4,
  uint64: 8,
} as const;
export type CodecDtype = keyof typeof CODEC_DTYPE_SIZES;

export function isCodecDtype(name: unknown): name is CodecDtype {
  return typeof name === 'string' && Object.hasOwn(CODEC_DTYPE_SIZES, name);
}

/** Padded standard base64 as a JSON-schema pattern (the steering schema states it in the OpenAPI document). */
export const BASE64_PATTERN = '^[A-Za-z0-9+/]*={0,2}$';
const base64Text = new RegExp(BASE64_PATTERN);

/** Why `chars` characters cannot be padded base64, or null. */
export function base64LengthError(chars: number): string | null {
  return chars % 4 === 0 ? null : 'must be padded standard base64 (length a multiple of 4)';
}

/** Why `data` is not padded standard base64, or null when it is. Length first: it costs nothing. */
export function base64TextError(data: string): string | null {
  return base64LengthError(data.length) ?? (base64Text.test(data) ? null : 'must be standard base64 text');
}

/** Bytes that `chars` characters of padded base64 ending in `padding` '=' signs decode to. */
export function base64DecodedLength(chars: number, padding: number): number {
  return (chars / 4) * 3 - padding;
}

/** Characters of padded base64 that encode `bytes` bytes. */
export function base64EncodedLength(bytes: number): number {
  return Math.ceil(bytes / 3) * 4;
}

/** '=' signs at the end of a base64 text (0, 1 or 2). */
export function base64Padding(tail: string | Uint8Array): number {
  const at = (i: number) => (typeof tail === 'string' ? tail.charCodeAt(i) : tail[i]);
  const n = tail.length;
  if (n >= 2 && at(n - 1) === 0x3d && at(n - 2) === 0x3d) return 2;
  return n >= 1 && at(n - 1) === 0x3d ? 1 : 0;
}

/** Raw bytes a tensor of `shape` and `dtype` holds (uncompressed). */
export function tensorByteLength(shape: readonly number[], dtype: CodecDtype): number {
  let n = CODEC_DTYPE_SIZES[dtype];
  for (const d of shape) n *= d;
  return n;
}

const ZSTD_MAGIC = 0xfd2fb528;
/** Base64 characters that always cover a zstd frame header up to its content size (18 bytes at most). */
export const ZSTD_HEADER_BASE64_CHARS = 24;

/**
 * Frame_Content_Size of a zstd frame (RFC 8878 3.1.1.1), read from the frame's first bytes only;
 * null when the frame does not record it, 'not-zstd' when the bytes are no zstd frame header.
 */
export function zstdContentSize(head: Uint8Array): number | null | 'not-zstd' {
  const b = Buffer.from(head.buffer, head.byteOffset, head.byteLength);
  if (b.length < 6 || b.readUInt32LE(0) !== ZSTD_MAGIC) return 'not-zstd';
  const descriptor = b[4];
  const fcsFlag = descriptor >> 6;
  const singleSegment = (descriptor >> 5) & 1;
  const dictIdFlag = descriptor & 3;
  const fcsBytes = fcsFlag === 0 ? (singleSegment ? 1 : 0) : [0, 2, 4, 8][fcsFlag];
  if (fcsBytes === 0) return null;
  const offset = 5 + (singleSegment ? 0 : 1) + [0, 1, 2, 4][dictIdFlag];
  if (b.length < offset + fcsBytes) return 'not-zstd';
  switch (fcsBytes) {
    case 1:
      return b[offset];
    case 2:
      return b.readUInt16LE(offset) + 256;
    case 4:
      return b.readUInt32LE(offset);
    default:
      return Number(b.readBigUInt64LE(offset));
  }
}

/** The same, from the first base64 characters of a codec's `data`. */
export function zstdContentSizeOfBase64(dataHead: string): number | null | 'not-zstd' {
  return zstdContentSize(Buffer.from(dataHead.slice(0, ZSTD_HEADER_BASE64_CHARS), 'base64'));
}

/** What a walk over a zstd frame's block headers finds (RFC 8878 3.1.1). */
export type ZstdFrameWalk =
  | { ok: true; end: number; contentSize: number | null }
  | { ok: false; reason: string };

/**
 * Walks the frame starting at byte 0 from header to end through its block headers, without decoding
 * anything: where it ends, and the content size its header declares. A frame whose blocks run past the
 * bytes, or use a reserved block type or descriptor bit, is not a frame.
 */
export function walkZstdFrame(bytes: Uint8Array): ZstdFrameWalk {
  const b = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const contentSize = zstdContentSize(b);
  if (contentSize === 'not-zstd') return { ok: false, reason: 'not a zstd frame' };
  const descriptor = b[4];
  if (descriptor & 0x08) return { ok: false, reason: 'a reserved bit of the zstd frame header is set' };
  const fcsFlag = descriptor >> 6;
  const singleSegment = (descriptor >> 5) & 1;
  const checksum = (descriptor >> 2) & 1;
  const fcsBytes = fcsFlag === 0 ? (singleSegment ? 1 : 0) : [0, 2, 4, 8][fcsFlag];
  let at = 5 + (singleSegment ? 0 : 1) + [0, 1, 2, 4][descriptor & 3] + fcsBytes;
  for (;;) {
    if (at + 3 > b.length) return { ok: false, reason: 'the zstd frame is cut short' };
    const header = b[at] | (b[at + 1] << 8) | (b[at + 2] << 16);
    at += 3;
    const last = header & 1;
    const type = (header >> 1) & 3;
    const size = header >>> 3;
    if (type === 3) return { ok: false, reason: 'the zstd frame holds a reserved block type' };
    at += type === 1 ? 1 : size; // an RLE block is one byte repeated `size` times
    if (at > b.length) return { ok: false, reason: 'the zstd frame is cut short' };
    if (last) break;
  }
  at += checksum ? 4 : 0;
  if (at > b.length) return { ok: false, reason: 'the zstd frame is cut short' };
  return { ok: true, end: at, contentSize };
}
