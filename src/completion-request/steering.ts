// Checks of a steering vector that a schema cannot state: the codec envelope's byte size against its
// shape and dtype, the layer list against the shape, positions only for a 3-D tensor, layer ranges.
// The tensor itself is never decoded (the contract: validate the envelope and bound its size).
import type { ApiError } from '../errors/index.ts';
import { base64DecodedLength, base64LengthError, base64Padding, tensorByteLength, zstdContentSizeOfBase64, type CodecDtype } from '../codec/index.ts';
import type { SteeringVector } from './schema.ts';
import { invalid } from './schema-errors.ts';

const FIELD = 'apply_steering_vectors';

/** The first problem of steering vector `i`, or null. `nLayers` is the model's layer count when known. */
export function steeringVectorError(v: SteeringVector, i: number, nLayers: number | null): ApiError | null {
  const at = `${FIELD}[${i}]`;
  const { data, shape, dtype, compression } = v.activations;
  // The schema has checked the alphabet (BASE64_PATTERN); the length rule is the one it cannot state.
  const base64Error = base64LengthError(data.length);
  if (base64Error) return invalid(FIELD, `${at}.activations.data: ${base64Error}`);
  const expected = tensorByteLength(shape, dtype as CodecDtype);
  if (compression === 'zstd') {
    const size = zstdContentSizeOfBase64(data);
    if (size === 'not-zstd') return invalid(FIELD, `${at}.activations.data: compression is "zstd" but the data is not a zstd frame`);
    if (size === null) return invalid(FIELD, `${at}.activations.data: the zstd frame must record its content size`);
    if (size !== expected) {
      return invalid(FIELD, `${at}.activations.data: decompresses to ${size} bytes but shape [${shape.join(', ')}] of ${dtype} needs ${expected}`);
    }
  } else {
    const bytes = base64DecodedLength(data.length, base64Padding(data));
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
