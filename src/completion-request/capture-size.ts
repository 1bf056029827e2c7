// How large a residual-stream capture can be: positions allowed per layer count, and the response body in
// bytes (bf16 values as base64, plus the JSON around them). The pre-flight and `/v1/models` both read it.
import { base64EncodedLength } from '../codec/index.ts';
import type { ModelConfig } from '../config/index.ts';
import type { Tokenizer } from '../tokenizer/index.ts';

/**
 * JSON around the tensor in a capture body: a fixed allowance plus a share per position, the text
 * (echoed prompt and completion) of that position's token: at least 64 bytes, more for a tokenizer
 * with tokens whose text JSON makes longer (`tokenTextJsonBytes`).
 */
export const CAPTURE_JSON_FIXED_BYTES = 64 * 1024;
export const CAPTURE_JSON_BYTES_PER_POSITION = 64;
/** Captures travel as bf16 (ENGINE.md): two bytes per value before base64. */
const CAPTURE_ITEM_BYTES = 2;

/**
 * Upper bound of a capture response's size: base64 of layers × positions × d_model bf16 values plus its
 * JSON, `perPosition` bytes of it per position (`captureBytesPerPosition`: no default, which a caller
 * could forget and so understate a tokenizer's bound).
 */
export function captureBodyBytes(layers: number, positions: number, dModel: number, perPosition: number): number {
  return base64EncodedLength(layers * positions * dModel * CAPTURE_ITEM_BYTES) + CAPTURE_JSON_FIXED_BYTES + positions * perPosition;
}

const textBound = new WeakMap<Tokenizer, number>();

/**
 * The most one token can add to a response's JSON text, over the whole vocabulary. A character that is
 * whole within the token stays whole in any text around it (UTF-8 resynchronises), so it counts as JSON
 * writes it (a control character as `\u00XX`: 6 bytes; `"` and `\`: 2; else its own bytes); any other
 * byte may end up in a U+FFFD, 3 bytes, and counts as one. Special tokens count by their text too (an
 * echoed prompt shows its BOS).
 */
export function tokenTextJsonBytes(tokenizer: Tokenizer): number {
  let most = textBound.get(tokenizer);
  if (most !== undefined) return most;
  most = 0;
  for (let id = 0; id < tokenizer.vocabSize; id++) most = Math.max(most, jsonTextBytes(tokenizer.tokenBytes(id)));
  textBound.set(tokenizer, most);
  return most;
}

function jsonTextBytes(bytes: Uint8Array): number {
  let out = 0;
  for (let i = 0; i < bytes.length; ) {
    const length = wholeCharacterAt(bytes, i);
    if (length === 0) {
      out += 3;
      i++;
    } else {
      const b = bytes[i];
      out += b < 0x20 ? 6 : b === 0x22 || b === 0x5c ? 2 : length;
      i += length;
    }
  }
  return out;
}

/** The length of the well-formed UTF-8 character starting at `i` (RFC 3629's table), 0 when there is none. */
function wholeCharacterAt(bytes: Uint8Array, i: number): number {
  const b = bytes[i];
  if (b < 0x80) return 1;
  const [length, low, high] = b >= 0xc2 && b <= 0xdf ? [2, 0x80, 0xbf] : b === 0xe0 ? [3, 0xa0, 0xbf] : b === 0xed ? [3, 0x80, 0x9f] : b >= 0xe1 && b <= 0xef ? [3, 0x80, 0xbf] : b === 0xf0 ? [4, 0x90, 0xbf] : b >= 0xf1 && b <= 0xf3 ? [4, 0x80, 0xbf] : b === 0xf4 ? [4, 0x80, 0x8f] : [0, 0, 0];
  if (length === 0 || i + length > bytes.length || bytes[i + 1] < low || bytes[i + 1] > high) return 0;
  for (let k = 2; k < length; k++) if (bytes[i + k] < 0x80 || bytes[i + k] > 0xbf) return 0;
  return length;
}

/** The JSON a capture body may hold per position for a model with this tokenizer (null: not loaded, the floor). */
export function captureBytesPerPosition(tokenizer: Tokenizer | null): number {
  return Math.max(CAPTURE_JSON_BYTES_PER_POSITION, tokenizer ? tokenTextJsonBytes(tokenizer) : 0);
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

/**
 * Positions a capture of `layers` layers may span within `activations.max_capture_bytes`; Infinity when
 * unbounded. `tokenizer`: the model's (null while it is not loaded: the per-position floor).
 */
export function captureBytePositionLimit(model: ModelConfig, layers: number | null, tokenizer: Tokenizer | null): number {
  const bound = model.activations?.max_capture_bytes;
  const dModel = captureDModel(model);
  if (bound === undefined || dModel === null || layers === null) return Infinity;
  const perPosition = captureBytesPerPosition(tokenizer);
  // captureBodyBytes grows with positions; start from the linear estimate and settle on the exact edge.
  let p = Math.max(0, Math.floor((bound - CAPTURE_JSON_FIXED_BYTES) / ((layers * dModel * CAPTURE_ITEM_BYTES * 4) / 3 + perPosition)));
  while (captureBodyBytes(layers, p + 1, dModel, perPosition) <= bound) p++;
  while (p > 0 && captureBodyBytes(layers, p, dModel, perPosition) > bound) p--;
  return p;
}

/**
 * The largest capture body (bytes) the model's configuration admits, over every layer count, with the
 * model's tokenizer (null: the per-position floor); null when n_layers or d_model is unknown. Equals
 * max_capture_bytes at most.
 */
export function largestCaptureBytes(model: ModelConfig, tokenizer: Tokenizer | null): number | null {
  const act = model.activations ?? null;
  const dModel = captureDModel(model);
  if (act === null || act.n_layers === null || dModel === null) return null;
  const perPosition = captureBytesPerPosition(tokenizer);
  let largest = 0;
  for (let layers = 1; layers <= act.n_layers; layers++) {
    const positions = Math.min(capturePositionLimit(model, layers), captureBytePositionLimit(model, layers, tokenizer));
    if (positions > 0) largest = Math.max(largest, captureBodyBytes(layers, positions, dModel, perPosition));
  }
  return largest;
}
