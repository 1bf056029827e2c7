// Checks of a steering vector that a schema cannot state: the codec envelope's byte size against its
// shape and dtype, the layer list against the shape, positions only for a 3-D tensor, layer ranges.
// The tensor itself is never decoded (the contract: validate the envelope and bound its size).
import type { ApiError } from '../errors/index.ts';
import { CODEC_DTYPE_SIZES, type SteeringVector, type CodecDtype } from './schema.ts';
import { invalid } from './schema-errors.ts';

const ZSTD_MAGIC = 0xfd2fb528;
const FIELD = 'apply_steering_vectors';

/** The first problem of steering vector `i`, or null. `nLayers` is the model's layer count when known. */
export function steeringVectorError(v: SteeringVector, i: number, nLayers: number | null): ApiError | null {
  const at = `${FIELD}[${i}]`;
  const { data, shape, dtype, compression } = v.activations;
  if (data.length % 4 !== 0) return invalid(FIELD, `${at}.activations.data: must be padded standard base64 (length a multiple of 4)`);
  const expected = shape.reduce((a, b) => a * b, 1) * CODEC_DTYPE_SIZES[dtype as CodecDtype];
  if (compression === 'zstd') {
    const size = zstdContentSize(data);
    if (size === 'not-zstd') return invalid(FIELD, `${at}.activations.data: compression is "zstd" but the data is not a zstd frame`);
    if (size === null) return invalid(FIELD, `${at}.activations.data: the zstd frame must record its content size`);
    if (size !== expected) {
      return invalid(FIELD, `${at}.activations.data: decompresses to ${size} bytes but shape [${shape.join(', ')}] of ${dtype} needs ${expected}`);
    }
  } else {
    const bytes = base64Length(data);
    if (bytes !== expected) {
      return invalid(FIELD, `${at}.activations.data: decodes to ${bytes} bytes but shape [${shape.join(', ')}] of ${dtype} needs ${expected}`);
    }
  }
  if (v.layer_indices.length !== shape[0]) {
    return invalid(FIELD, `${at}.layer_indices: has ${v.layer_indices.length} entries but activations.shape[0] is ${shape[0]}`);
  }
  if (nLayers !== null) {
    const bad = v.layer_indices.findIndex((l) => l >= nLayers);
    if (bad >= 0) return invalid(FIELD, `${at}.layer_indices[${bad}]: layer ${v.layer_indices[bad]} is out of range (the model has layers 0..${nLayers - 1})`);
  }
  const positions = v.position_indices;
  if (positions !== undefined && positions !== null) {
    if (shape.length !== 3) {
      return invalid(FIELD, `${at}.position_indices: only allowed with a 3-D activations tensor (n_layers, n_positions, d_model)`);
    }
    if (positions.length !== shape[1]) {
      return invalid(FIELD, `${at}.position_indices: has ${positions.length} entries but activations.shape[1] is ${shape[1]}`);
    }
  }
  return null;
}

/** Bytes a padded standard base64 string decodes to. */
function base64Length(data: string): number {
  const pad = data.endsWith('==') ? 2 : data.endsWith('=') ? 1 : 0;
  return (data.length / 4) * 3 - pad;
}

/**
 * Frame_Content_Size from a zstd frame header (RFC 8878 3.1.1.1), read from the first base64 characters
 * only; null when the frame does not record it. Bounds what the engine would decompress.
 */
function zstdContentSize(data: string): number | null | 'not-zstd' {
  const head = Buffer.from(data.slice(0, 24), 'base64');
  if (head.length < 6 || head.readUInt32LE(0) !== ZSTD_MAGIC) return 'not-zstd';
  const descriptor = head[4];
  const fcsFlag = descriptor >> 6;
  const singleSegment = (descriptor >> 5) & 1;
  const dictIdFlag = descriptor & 3;
  const fcsBytes = fcsFlag === 0 ? (singleSegment ? 1 : 0) : [0, 2, 4, 8][fcsFlag];
  if (fcsBytes === 0) return null;
  const offset = 5 + (singleSegment ? 0 : 1) + [0, 1, 2, 4][dictIdFlag];
  if (head.length < offset + fcsBytes) return 'not-zstd';
  switch (fcsBytes) {
    case 1:
      return head[offset];
    case 2:
      return head.readUInt16LE(offset) + 256;
    case 4:
      return head.readUInt32LE(offset);
    default:
      return Number(head.readBigUInt64LE(offset));
  }
}
