// Checks of a steering vector that a schema cannot state: the tensor's shape against the model (its
// layers, its residual stream's width, its context), the codec envelope's byte size against its shape
// and dtype (for zstd: one whole frame, walked through its block headers, declaring exactly that size),
// the layer list against the shape, positions only for a 3-D tensor, layer ranges. The tensor itself
// is never decoded (the contract: validate the envelope and bound its size), and a vector that fails
// reaches no engine.
import type { ApiError } from '../errors/index.ts';
import { base64DecodedLength, base64LengthError, base64Padding, tensorByteLength, walkZstdFrame, type CodecDtype } from '../codec/index.ts';
import type { SteeringVector } from './schema.ts';
import { invalid } from './schema-errors.ts';

const FIELD = 'apply_steering_vectors';

/** What the gateway knows of the model a vector steers; null where the configuration does not say. */
export interface SteeringModel {
  id: string;
  nLayers: number | null;
  /** The residual stream's width. */
  dModel: number | null;
  /** The model's context: the most positions a 3-D vector can name. */
  maxPositions: number | null;
}

/** The first problem of steering vector `i`, or null. */
export function steeringVectorError(v: SteeringVector, i: number, model: SteeringModel): ApiError | null {
  const at = `${FIELD}[${i}]`;
  const { data, shape, dtype, compression } = v.activations;
  const { nLayers, dModel, maxPositions } = model;
  // The shape against the model first: it bounds what the data may decode to.
  const width = shape[shape.length - 1];
  if (dModel !== null && width !== dModel) {
    return invalid(FIELD, `${at}.activations.shape[${shape.length - 1}]: is ${width} but model ${model.id}'s residual stream is ${dModel} wide (d_model)`);
  }
  if (nLayers !== null && shape[0] > nLayers) {
    return invalid(FIELD, `${at}.activations.shape[0]: is ${shape[0]} but model ${model.id} has ${nLayers} layers`);
  }
  if (shape.length === 3 && maxPositions !== null && shape[1] > maxPositions) {
    return invalid(FIELD, `${at}.activations.shape[1]: is ${shape[1]} positions but model ${model.id}'s context is ${maxPositions} (max_model_len)`);
  }
  // The schema has checked the alphabet (BASE64_PATTERN); the length rule is the one it cannot state.
  const base64Error = base64LengthError(data.length);
  if (base64Error) return invalid(FIELD, `${at}.activations.data: ${base64Error}`);
  const expected = tensorByteLength(shape, dtype as CodecDtype);
  if (compression === 'zstd') {
    // The whole data (at most 384 KiB) is walked: a frame declaring the shape's size and followed by
    // more frames, or cut short, would decode to something else than the shape says.
    const frame = walkZstdFrame(Buffer.from(data, 'base64'));
    if (!frame.ok) {
      const what = frame.reason === 'not a zstd frame' ? 'compression is "zstd" but the data is not a zstd frame' : frame.reason;
      return invalid(FIELD, `${at}.activations.data: ${what}`);
    }
    const size = frame.contentSize;
    if (size === null) return invalid(FIELD, `${at}.activations.data: the zstd frame must record its content size`);
    if (size !== expected) {
      return invalid(FIELD, `${at}.activations.data: decompresses to ${size} bytes but shape [${shape.join(', ')}] of ${dtype} needs ${expected}`);
    }
    const bytes = base64DecodedLength(data.length, base64Padding(data));
    if (frame.end !== bytes) return invalid(FIELD, `${at}.activations.data: must be one zstd frame (${bytes - frame.end} bytes follow it)`);
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
