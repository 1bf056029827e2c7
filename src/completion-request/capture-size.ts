// How large a residual-stream capture can be: positions allowed per layer count, and the response body in
// bytes (bf16 values as base64, plus the JSON around them). The pre-flight and `/v1/models` both read it.
import { base64EncodedLength } from '../codec/index.ts';
import type { ModelConfig } from '../config/index.ts';

/** JSON around the tensor in a capture body: a fixed allowance plus a share per position (text, offsets). */
export const CAPTURE_JSON_FIXED_BYTES = 64 * 1024;
export const CAPTURE_JSON_BYTES_PER_POSITION = 64;
/** Captures travel as bf16 (ENGINE.md): two bytes per value before base64. */
const CAPTURE_ITEM_BYTES = 2;

/** Upper bound of a capture response's size: base64 of layers × positions × d_model bf16 values plus its JSON. */
export function captureBodyBytes(layers: number, positions: number, dModel: number): number {
  return base64EncodedLength(layers * positions * dModel * CAPTURE_ITEM_BYTES) + CAPTURE_JSON_FIXED_BYTES + positions * CAPTURE_JSON_BYTES_PER_POSITION;
}

/** The residual stream's width when the configuration knows it. */
export function captureDModel(model: ModelConfig): number | null {
  return model.activations?.d_model ?? model.architecture?.d_model ?? null;
}

/**
 * Positions (prompt tokens + max_tokens - 1) a capture of `layers` layers may span by the position caps:
 * max_activation_prompt_tokens scaled by n_layers / layers (1 when either is unknown), and max_model_len.
 */
export function capturePositionLimit(model: ModelConfig, layers: number | null): number {
  const act = model.activations!;
  const ratio = act.n_layers !== null && layers !== null ? act.n_layers / layers : 1;
  const scaled = Math.floor(act.max_activation_prompt_tokens * ratio);
  const maxModelLen = model.capabilities.max_model_len;
  return maxModelLen !== null ? Math.min(maxModelLen, scaled) : scaled;
}

/** Positions a capture of `layers` layers may span within `activations.max_capture_bytes`; Infinity when unbounded. */
export function captureBytePositionLimit(model: ModelConfig, layers: number | null): number {
  const bound = model.activations?.max_capture_bytes;
  const dModel = captureDModel(model);
  if (bound === undefined || dModel === null || layers === null) return Infinity;
  // captureBodyBytes grows with positions; start from the linear estimate and settle on the exact edge.
  let p = Math.max(0, Math.floor((bound - CAPTURE_JSON_FIXED_BYTES) / ((layers * dModel * CAPTURE_ITEM_BYTES * 4) / 3 + CAPTURE_JSON_BYTES_PER_POSITION)));
  while (captureBodyBytes(layers, p + 1, dModel) <= bound) p++;
  while (p > 0 && captureBodyBytes(layers, p, dModel) > bound) p--;
  return p;
}

/**
 * The largest capture body (bytes) the model's configuration admits, over every layer count; null when
 * n_layers or d_model is unknown. Equals max_capture_bytes at most.
 */
export function largestCaptureBytes(model: ModelConfig): number | null {
  const act = model.activations ?? null;
  const dModel = captureDModel(model);
  if (act === null || act.n_layers === null || dModel === null) return null;
  let largest = 0;
  for (let layers = 1; layers <= act.n_layers; layers++) {
    const positions = Math.min(capturePositionLimit(model, layers), captureBytePositionLimit(model, layers));
    if (positions > 0) largest = Math.max(largest, captureBodyBytes(layers, positions, dModel));
  }
  return largest;
}
