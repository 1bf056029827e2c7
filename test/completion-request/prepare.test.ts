// One table: every validation and pre-flight rule of POST /v1/completions with its status and code,
// including the largest accepted and smallest rejected value of each bound, plus the engine body.
// Real tokenizers and the real model configuration (infra/config/default.json); variants of those
// models cover capabilities the default file does not exercise (unknown context, no activation engine).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { zstdCompress, zstdDecompressInto } from '../../src/codec/zstd.ts';
import { loadSettings, type ModelConfig } from '../../src/config/index.ts';
import { ApiError, type ErrorCode } from '../../src/errors/index.ts';
import { ModelRegistry } from '../../src/registry/index.ts';
import type { Tokenizer } from '../../src/tokenizer/index.ts';
import {
  prepareCompletion,
  lowerMaxTokens,
  fitDefaultToContext,
  needsEngineContextLength,
  deadlineFeasibleTokens,
  formatMaxTokensClamped,
  captureBodyBytes,
  captureBytesPerPosition,
  largestCaptureBytes,
  tokenTextJsonBytes,
  withExactSeed,
  type CompletionContext,
  type PreparedCompletion,
} from '../../src/completion-request/index.ts';

const settings = loadSettings({});
const byId = (id: string) => settings.models.find((m) => m.id === id)!;
const byteModel = byId('ref-byte'); // max_model_len 32768, 4 layers, capture cap 8192, byte tokenizer (BOS added)
const gpt2Model = byId('ref-gpt2'); // max_model_len 2048, 2 layers, r50k_base tokenizer

function variant(base: ModelConfig, id: string, patch: Partial<ModelConfig> & { caps?: Partial<ModelConfig['capabilities']> }): ModelConfig {
  const { caps, ...rest } = patch;
  return { ...base, default: false, ...rest, id, capabilities: { ...base.capabilities, ...caps } };
}

const models: ModelConfig[] = [
  byteModel,
  gpt2Model,
  variant(byteModel, 'byte-nolen', { caps: { max_model_len: null } }),
  variant(byteModel, 'byte-big', { caps: { max_model_len: null, max_output_work_tokens: 1_000_000 } }),
  variant(byteModel, 'byte-lp5', { caps: { max_logprobs: 5, prompt_logprobs_full_vocab: false } }),
  variant(byteModel, 'byte-noact', { activations: null }),
  variant(byteModel, 'byte-layers-unknown', { activations: { ...byteModel.activations!, n_layers: null } }),
  variant(byteModel, 'byte-width-unknown', { architecture: undefined, activations: { ...byteModel.activations!, d_model: null } }),
  variant(byteModel, 'byte-staging', { status: 'staging' }),
  // A gateway that serves captures of this model up to 1 MB: 1251 positions with all 4 layers (d_model 64).
  variant(byteModel, 'byte-cap1m', { activations: { ...byteModel.activations!, max_capture_bytes: 1_000_000 } }),
];
const registry = new ModelRegistry(models);
await registry.loadTokenizers();
const brokenRegistry = new ModelRegistry(
  [byteModel, variant(gpt2Model, 'ref-hf', { tokenizer: { kind: 'hf', path: join(tmpdir(), 'svc-no-such-dir', 'tokenizer.json') } })],
  { retryInitialMs: 3_600_000, retryMaxMs: 3_600_000 },
);
await brokenRegistry.loadTokenizers();

test('the hand-made RLE frame is a real zstd frame', () => {
  assert.is(zstdDecompressInto(rleFrame(300_000), new Uint8Array(300_000)), 300_000);
});

const ctx: CompletionContext = { registry, requestWindowMs: settings.requestWindowMs, deadlineTokensPerSecond: settings.deadlineTokensPerSecond };
const FEASIBLE = 15_600; // 14 minutes at 20 tokens/s, minus one minute for prompt processing and queueing

// ---- builders ------------------------------------------------------------------------------------
/** k characters: k + 1 tokens on the byte tokenizer with add_special_tokens (BOS). */
const x = (k: number) => 'x'.repeat(k);
const ids = (k: number) => Array.from({ length: k }, () => 1);
const zeros64 = (bytes: number) => Buffer.alloc(bytes).toString('base64');
const codec = (shape: number[], extra: Record<string, unknown> = {}) => ({
  data: zeros64(shape.reduce((a, b) => a * b, 1) * 4),
  dtype: 'float32',
  shape,
  ...extra,
});
/** ref-byte's residual stream width (d_model): a steering vector's last dimension. */
const W = 64;
const vec = (layers: number[] = [0], extra: Record<string, unknown> = {}) => ({ activations: codec([layers.length, W]), layer_indices: layers, ...extra });
const withCodec = (activations: Record<string, unknown>, layers: number[] = [0], extra: Record<string, unknown> = {}) => ({ activations, layer_indices: layers, ...extra });
/** A real zstd frame of RLE blocks (128 KiB each) declaring and holding `size` zero bytes: 4 bytes per 128 KiB. */
function rleFrame(size: number): Buffer {
  const blocks = Math.max(1, Math.ceil(size / 131_072));
  const b = Buffer.alloc(13 + blocks * 4);
  b.writeUInt32LE(0xfd2fb528, 0);
  b[4] = 0xe0; // 8-byte content size, single segment
  b.writeBigUInt64LE(BigInt(size), 5);
  for (let i = 0, left = size; i < blocks; i++) {
    const n = Math.min(left, 131_072);
    left -= n;
    b.writeUIntLE((i === blocks - 1 ? 1 : 0) | (1 << 1) | (n << 3), 13 + i * 4, 3); // last?, RLE, size; then the byte 0
  }
  return b;
}
const zstd256 = Buffer.from(zstdCompress(new Uint8Array(256), 1)).toString('base64'); // a real frame recording content size 256

// ---- the table ----------------------------------------------------------------------------------
interface Rejection {
  status: number;
  code: ErrorCode;
  message?: string | RegExp;
  headers?: Record<string, string | RegExp>;
}
interface Row {
  name: string;
  body: unknown;
  ctx?: Partial<CompletionContext>;
  reject?: Rejection;
  accept?: (p: PreparedCompletion) => void;
}

const bad = (message?: string | RegExp): Rejection => ({ status: 400, code: 'invalid_request', message });
const ok = (check?: (p: PreparedCompletion) => void) => check ?? (() => {});
const maxIs = (n: number, header: string | null = null) => (p: PreparedCompletion) => {
  assert.is(p.maxTokens, n);
  assert.is(p.engineBody.max_tokens, n);
  assert.is(p.maxTokensClamped, header);
};

const rows: Row[] = [
  // Body and unknown fields.
  ...[[], 'hello', null, 5].map((body) => ({ name: `body ${JSON.stringify(body)} is not an object`, body, reject: bad('body: must be a JSON object') })),
  { name: 'prompt is required', body: { max_tokens: 5 }, reject: bad('prompt: is required') },
  ...['extra_body', 'vllm_xargs', 'best_of', 'suffix', 'messages', 'logit_bias', 'response_format', 'Prompt'].map((field) => ({
    name: `unknown field ${field}`,
    body: { prompt: 'a', [field]: field === 'best_of' ? 2 : {} },
    reject: bad(`unknown field: ${field}`),
  })),

  // Prompt shapes.
  { name: 'prompt: string', body: { prompt: 'hello', max_tokens: 5 }, accept: (p) => assert.equal(p.promptTokenCounts, [6]) },
  { name: 'prompt: empty string (BOS only)', body: { prompt: '', max_tokens: 5 }, accept: (p) => assert.equal(p.promptTokenCounts, [1]) },
  { name: 'prompt: string[]', body: { prompt: ['a', 'bc'], max_tokens: 5 }, accept: (p) => (assert.is(p.promptCount, 2), assert.equal(p.promptTokenCounts, [2, 3])) },
  { name: 'prompt: int[]', body: { prompt: [1, 2, 3], max_tokens: 5 }, accept: (p) => (assert.is(p.promptCount, 1), assert.equal(p.promptTokenCounts, [3])) },
  { name: 'prompt: int[][]', body: { prompt: [[1], [2, 3]], max_tokens: 5 }, accept: (p) => (assert.is(p.promptCount, 2), assert.equal(p.promptTokenCounts, [1, 2])) },
  { name: 'prompt: []', body: { prompt: [], max_tokens: 5 }, reject: bad('prompt: must not be an empty list') },
  { name: 'prompt: [[]]', body: { prompt: [[]], max_tokens: 5 }, reject: bad('prompt[0]: a token-id prompt must not be empty') },
  { name: 'prompt: batch holding an empty token-id list', body: { prompt: [[1], []], max_tokens: 5 }, reject: bad('prompt[1]: a token-id prompt must not be empty') },
  { name: 'prompt: mixed strings and ids', body: { prompt: ['a', 1], max_tokens: 5 }, reject: bad(/^prompt: mixed lists are not accepted; prompt must be a string, a list of strings/) },
  { name: 'prompt: mixed ids and lists', body: { prompt: [1, [2]], max_tokens: 5 }, reject: bad('prompt: mixed lists') },
  { name: 'prompt: fractional token id', body: { prompt: [1.5], max_tokens: 5 }, reject: bad('prompt[0]: token ids must be non-negative integers') },
  { name: 'prompt: negative token id', body: { prompt: [[1], [2, -1]], max_tokens: 5 }, reject: bad('prompt[1][1]: token ids must be non-negative integers') },
  { name: 'prompt: object', body: { prompt: { text: 'a' } }, reject: bad(/^prompt: must be a string, a list of strings, a list of token ids, or a list of non-empty token-id lists$/) },
  { name: 'prompt: null', body: { prompt: null }, reject: bad('prompt: must be a string') },
  { name: 'prompt: list of booleans', body: { prompt: [true], max_tokens: 5 }, reject: bad('prompt[0]: must be a string, a token id or a list of token ids') },
  { name: 'prompt: largest token id (vocab 258)', body: { prompt: [257], max_tokens: 5 }, accept: ok() },
  { name: 'prompt: token id = vocab size', body: { prompt: [258], max_tokens: 5 }, reject: bad('prompt[0]: token id 258 is out of range') },
  { name: 'prompt: batch token id out of range', body: { prompt: [[1], [1, 258]], max_tokens: 5 }, reject: bad('prompt[1][1]: token id 258 is out of range') },
  { name: 'prompt: r50k largest id', body: { model: 'ref-gpt2', prompt: [50256], max_tokens: 5 }, accept: ok() },
  { name: 'prompt: r50k id 50257', body: { model: 'ref-gpt2', prompt: [50257], max_tokens: 5 }, reject: bad('token id 50257 is out of range') },

  // Numbers reject booleans and strings; integers reject fractions; floats accept integers.
  ...['max_tokens', 'n', 'temperature', 'top_p', 'top_k', 'min_p', 'presence_penalty', 'frequency_penalty', 'repetition_penalty', 'seed', 'logprobs', 'prompt_logprobs'].flatMap(
    (field) => [true, '1'].map((value) => ({ name: `${field}: ${JSON.stringify(value)}`, body: { prompt: 'a', max_tokens: 5, [field]: value }, reject: bad(new RegExp(`^${field}: must be`)) })),
  ),
  ...['max_tokens', 'n', 'top_k', 'seed', 'logprobs', 'prompt_logprobs'].map((field) => ({
    name: `${field}: fraction`,
    body: { prompt: 'a', max_tokens: 5, [field]: 1.5 },
    reject: bad(new RegExp(`^${field}: must be`)),
  })),
  ...['echo', 'stream', 'add_special_tokens'].flatMap((field) =>
    [1, 'true', null].map((value) => ({ name: `${field}: ${JSON.stringify(value)}`, body: { prompt: 'a', max_tokens: 5, [field]: value }, reject: bad(`${field}: must be a boolean`) })),
  ),
  { name: 'temperature: JSON integer accepted', body: { prompt: 'a', max_tokens: 5, temperature: 1 }, accept: (p) => assert.is(p.engineBody.temperature, 1) },

  // max_tokens.
  { name: 'max_tokens: 1', body: { prompt: 'a', max_tokens: 1 }, accept: maxIs(1) },
  { name: 'max_tokens: 0', body: { prompt: 'a', max_tokens: 0 }, reject: bad('max_tokens: must be an integer from 1 to 1000000, or null') },
  { name: 'max_tokens: 1,000,000 passes the schema', body: { model: 'byte-big', prompt: 'a', max_tokens: 1_000_000, stream: true }, accept: maxIs(1_000_000) },
  { name: 'max_tokens: 1,000,001', body: { model: 'byte-big', prompt: 'a', max_tokens: 1_000_001, stream: true }, reject: bad('max_tokens: must be an integer from 1 to 1000000') },
  { name: 'max_tokens: null on a single prompt', body: { prompt: 'a', max_tokens: null, stream: true }, accept: maxIs(32_000) },
  { name: 'max_tokens: omitted on a string batch', body: { prompt: ['a', 'b'] }, reject: bad('max_tokens: required for a batch of prompts or n > 1') },
  { name: 'max_tokens: omitted on a batch of one string (a list is a batch)', body: { prompt: ['a'] }, reject: bad('max_tokens: required for a batch of prompts or n > 1 (prompt_count 1, n 1)') },
  { name: 'max_tokens: omitted on a batch of one token-id list', body: { prompt: [[1, 2]] }, reject: bad('max_tokens: required') },
  { name: 'max_tokens: null on a token-id batch', body: { prompt: [[1], [2]], max_tokens: null }, reject: bad('max_tokens: required') },
  { name: 'max_tokens: omitted with n = 2', body: { prompt: 'a', n: 2 }, reject: bad('max_tokens: required for a batch of prompts or n > 1 (prompt_count 1, n 2)') },

  // n and the output-work cap.
  { name: 'n: 16 (16 × 2000 = 32,000)', body: { prompt: 'a', n: 16, max_tokens: 2000 }, accept: (p) => (assert.is(p.n, 16), assert.is(p.engineBody.n, 16)) },
  { name: 'n: 17', body: { prompt: 'a', n: 17, max_tokens: 1 }, reject: bad('n: must be <= 16') },
  { name: 'n: 0', body: { prompt: 'a', n: 0, max_tokens: 1 }, reject: bad('n: must be >= 1') },
  { name: 'work: 1 × 2 × 16,000 = 32,000', body: { prompt: 'a', n: 2, max_tokens: 16_000, stream: true }, accept: (p) => assert.is(p.workTokens, 2 + 32_000) },
  { name: 'work: 2 × 16 × 1000 = 32,000', body: { prompt: ['a', 'b'], n: 16, max_tokens: 1000 }, accept: (p) => assert.is(p.workTokens, 4 + 32_000) },
  { name: 'work: 3 × 1 × 10,666 = 31,998', body: { prompt: [[1], [2], [3]], max_tokens: 10_666, stream: true }, accept: ok() },
  { name: 'work: 3 × 1 × 10,667 = 32,001', body: { prompt: [[1], [2], [3]], max_tokens: 10_667, stream: true }, reject: bad('max_tokens: prompt_count (3) × n (1) × max_tokens (10667) = 32001 exceeds 32000') },
  { name: 'work: 2 × 16 × 1001', body: { prompt: ['a', 'b'], n: 16, max_tokens: 1001 }, reject: bad('= 32032 exceeds 32000') },

  // Sampling bounds.
  { name: 'temperature: 0', body: { prompt: 'a', max_tokens: 1, temperature: 0 }, accept: ok() },
  { name: 'temperature: 100', body: { prompt: 'a', max_tokens: 1, temperature: 100 }, accept: ok() },
  { name: 'temperature: 100.0001', body: { prompt: 'a', max_tokens: 1, temperature: 100.0001 }, reject: bad('temperature: must be <= 100') },
  { name: 'temperature: -0.0001', body: { prompt: 'a', max_tokens: 1, temperature: -0.0001 }, reject: bad('temperature: must be >= 0') },
  { name: 'top_p: 1', body: { prompt: 'a', max_tokens: 1, top_p: 1 }, accept: ok() },
  { name: 'top_p: 0.0001', body: { prompt: 'a', max_tokens: 1, top_p: 0.0001 }, accept: ok() },
  { name: 'top_p: 0', body: { prompt: 'a', max_tokens: 1, top_p: 0 }, reject: bad('top_p: must be > 0') },
  { name: 'top_p: 1.0001', body: { prompt: 'a', max_tokens: 1, top_p: 1.0001 }, reject: bad('top_p: must be <= 1') },
  { name: 'top_k: -1', body: { prompt: 'a', max_tokens: 1, top_k: -1 }, accept: ok() },
  { name: 'top_k: 1', body: { prompt: 'a', max_tokens: 1, top_k: 1 }, accept: ok() },
  { name: 'top_k: 0', body: { prompt: 'a', max_tokens: 1, top_k: 0 }, reject: bad('top_k: must be -1 (disabled) or an integer >= 1') },
  { name: 'top_k: -2', body: { prompt: 'a', max_tokens: 1, top_k: -2 }, reject: bad('top_k: must be -1') },
  { name: 'min_p: 0', body: { prompt: 'a', max_tokens: 1, min_p: 0 }, accept: ok() },
  { name: 'min_p: 1', body: { prompt: 'a', max_tokens: 1, min_p: 1 }, accept: ok() },
  { name: 'min_p: 1.0001', body: { prompt: 'a', max_tokens: 1, min_p: 1.0001 }, reject: bad('min_p: must be <= 1') },
  { name: 'min_p: -0.0001', body: { prompt: 'a', max_tokens: 1, min_p: -0.0001 }, reject: bad('min_p: must be >= 0') },
  ...['presence_penalty', 'frequency_penalty'].flatMap((field) => [
    { name: `${field}: -2`, body: { prompt: 'a', max_tokens: 1, [field]: -2 }, accept: ok() },
    { name: `${field}: 2`, body: { prompt: 'a', max_tokens: 1, [field]: 2 }, accept: ok() },
    { name: `${field}: 2.0001`, body: { prompt: 'a', max_tokens: 1, [field]: 2.0001 }, reject: bad(`${field}: must be <= 2`) },
    { name: `${field}: -2.0001`, body: { prompt: 'a', max_tokens: 1, [field]: -2.0001 }, reject: bad(`${field}: must be >= -2`) },
  ]),
  { name: 'repetition_penalty: 2', body: { prompt: 'a', max_tokens: 1, repetition_penalty: 2 }, accept: ok() },
  { name: 'repetition_penalty: 0.0001', body: { prompt: 'a', max_tokens: 1, repetition_penalty: 0.0001 }, accept: ok() },
  { name: 'repetition_penalty: 2.0001', body: { prompt: 'a', max_tokens: 1, repetition_penalty: 2.0001 }, reject: bad('repetition_penalty: must be <= 2') },
  { name: 'repetition_penalty: 0', body: { prompt: 'a', max_tokens: 1, repetition_penalty: 0 }, reject: bad('repetition_penalty: must be > 0') },
  { name: 'seed: 0', body: { prompt: 'a', max_tokens: 1, seed: 0 }, accept: (p) => assert.is(p.engineBody.seed, 0) },
  { name: 'seed: 12345 forwarded', body: { prompt: 'a', max_tokens: 1, seed: 12345 }, accept: (p) => assert.is(p.engineBody.seed, 12345) },
  {
    name: 'seed: 9223372036854775807 (2^63-1) accepted, forwarded within int64',
    body: JSON.parse('{"prompt": "a", "max_tokens": 1, "seed": 9223372036854775807}'),
    accept: (p) => {
      assert.is(p.engineBody.seed, 9223372036854774784);
      assert.match(JSON.stringify(p.engineBody), '"seed":9223372036854775000');
    },
  },
  {
    name: 'seed: 9223372036854775808 (2^63, which parses as the same double as 2^63-1): its literal decides',
    body: withExactSeed(JSON.parse('{"prompt": "a", "max_tokens": 1, "seed": 9223372036854775808}'), '{"prompt": "a", "max_tokens": 1, "seed": 9223372036854775808}'),
    reject: bad('seed: must be an integer from 0 to 9223372036854775807, or null'),
  },
  {
    name: 'seed: 9223372036854775807 read with its literal: still accepted',
    body: withExactSeed(JSON.parse('{"prompt":"a","max_tokens":1,"seed":9223372036854775807}'), '{"prompt":"a","max_tokens":1,"seed":9223372036854775807}'),
    accept: (p) => assert.is(p.engineBody.seed, 9223372036854774784),
  },
  {
    name: 'seed: 9223372036854777856 (first double above 2^63)',
    body: JSON.parse('{"prompt": "a", "max_tokens": 1, "seed": 9223372036854777856}'),
    reject: bad('seed: must be an integer from 0 to 9223372036854775807, or null'),
  },
  { name: 'seed: -1', body: { prompt: 'a', max_tokens: 1, seed: -1 }, reject: bad('seed: must be an integer from 0') },
  { name: 'stop: string', body: { prompt: 'a', max_tokens: 1, stop: '\n' }, accept: (p) => assert.is(p.engineBody.stop, '\n') },
  { name: 'stop: 4 strings', body: { prompt: 'a', max_tokens: 1, stop: ['a', 'b', 'c', 'd'] }, accept: (p) => assert.equal(p.engineBody.stop, ['a', 'b', 'c', 'd']) },
  { name: 'stop: 5 strings', body: { prompt: 'a', max_tokens: 1, stop: ['a', 'b', 'c', 'd', 'e'] }, reject: bad('stop: must be a string, a list of at most 4 strings, or null') },
  { name: 'stop: number entry', body: { prompt: 'a', max_tokens: 1, stop: ['a', 1] }, reject: bad('stop[1]: must be a string') },
  { name: 'logprobs: 0', body: { prompt: 'a', max_tokens: 1, logprobs: 0 }, accept: (p) => assert.is(p.engineBody.logprobs, 0) },
  { name: 'logprobs: 100 = max_logprobs', body: { prompt: 'a', max_tokens: 1, logprobs: 100 }, accept: ok() },
  { name: 'logprobs: 101', body: { prompt: 'a', max_tokens: 1, logprobs: 101 }, reject: bad('logprobs: must be an integer from 0 to 100, or null') },
  { name: 'logprobs: -1', body: { prompt: 'a', max_tokens: 1, logprobs: -1 }, reject: bad('logprobs: must be an integer from 0 to 100') },
  { name: 'logprobs: 5 = model max_logprobs', body: { model: 'byte-lp5', prompt: 'a', max_tokens: 1, logprobs: 5 }, accept: ok() },
  { name: 'logprobs: 6 > model max_logprobs', body: { model: 'byte-lp5', prompt: 'a', max_tokens: 1, logprobs: 6 }, reject: bad('logprobs: must be <= 5 on model byte-lp5') },
  { name: 'prompt_logprobs: 0', body: { prompt: 'a', max_tokens: 1, prompt_logprobs: 0 }, accept: ok() },
  { name: 'prompt_logprobs: 100', body: { prompt: 'a', max_tokens: 1, prompt_logprobs: 100 }, accept: ok() },
  { name: 'prompt_logprobs: 101', body: { prompt: 'a', max_tokens: 1, prompt_logprobs: 101 }, reject: bad('prompt_logprobs: must be -1 (full vocabulary), an integer from 0 to 100, or null') },
  { name: 'prompt_logprobs: -2', body: { prompt: 'a', max_tokens: 1, prompt_logprobs: -2 }, reject: bad('prompt_logprobs: must be -1') },
  { name: 'prompt_logprobs: 5 = model max_logprobs', body: { model: 'byte-lp5', prompt: 'a', max_tokens: 1, prompt_logprobs: 5 }, accept: ok() },
  { name: 'prompt_logprobs: 6 > model max_logprobs', body: { model: 'byte-lp5', prompt: 'a', max_tokens: 1, prompt_logprobs: 6 }, reject: bad('prompt_logprobs: must be <= 5 on model byte-lp5') },
  { name: 'prompt_logprobs: -1 unsupported by the model', body: { model: 'byte-lp5', prompt: 'a', max_tokens: 1, prompt_logprobs: -1 }, reject: bad('prompt_logprobs: -1 (full vocabulary) is not supported') },
  { name: 'prompt_logprobs: -1', body: { prompt: 'a', max_tokens: 1, prompt_logprobs: -1 }, accept: (p) => (assert.ok(p.fullVocab), assert.is(p.engineBody.prompt_logprobs, -1)) },

  // Streaming rules.
  { name: 'stream: prompt_logprobs 0 allowed', body: { prompt: 'a', max_tokens: 1, stream: true, prompt_logprobs: 0 }, accept: ok() },
  { name: 'stream: prompt_logprobs 1', body: { prompt: 'a', max_tokens: 1, stream: true, prompt_logprobs: 1 }, reject: bad('prompt_logprobs: values above 0 and -1 are not allowed with stream true') },
  { name: 'stream: prompt_logprobs -1', body: { prompt: 'a', max_tokens: 1, stream: true, prompt_logprobs: -1 }, reject: bad('prompt_logprobs: values above 0 and -1') },
  { name: 'stream_options without stream', body: { prompt: 'a', max_tokens: 1, stream_options: { include_usage: true } }, reject: bad('stream_options: only allowed with stream true') },
  { name: 'stream_options with stream false', body: { prompt: 'a', max_tokens: 1, stream: false, stream_options: {} }, reject: bad('stream_options: only allowed with stream true') },
  { name: 'stream_options null without stream', body: { prompt: 'a', max_tokens: 1, stream_options: null }, accept: (p) => assert.not.ok('stream_options' in p.engineBody) },
  { name: 'stream_options: unknown key', body: { prompt: 'a', max_tokens: 1, stream: true, stream_options: { include_usage: true, foo: 1 } }, reject: bad('unknown field: stream_options.foo') },
  { name: 'stream_options: non-boolean', body: { prompt: 'a', max_tokens: 1, stream: true, stream_options: { include_usage: 1 } }, reject: bad('stream_options.include_usage: must be a boolean') },
  { name: 'stream_options: not an object', body: { prompt: 'a', max_tokens: 1, stream: true, stream_options: true }, reject: bad('stream_options: must be an object') },
  {
    name: 'stream_options: explicit booleans sent; the client asked for the usage frame',
    body: { prompt: 'a', max_tokens: 1, stream: true, stream_options: { include_usage: true } },
    accept: (p) => (assert.equal(p.engineBody.stream_options, { include_usage: true, continuous_usage_stats: false }), assert.is(p.clientWantsUsage, true)),
  },
  {
    name: 'stream_options omitted: the engine is still asked for usage (streams are billed), the client did not ask',
    body: { prompt: 'a', max_tokens: 1, stream: true },
    accept: (p) => (assert.ok(p.stream), assert.equal(p.engineBody.stream_options, { include_usage: true, continuous_usage_stats: false }), assert.is(p.clientWantsUsage, false)),
  },
  {
    name: 'stream_options: continuous_usage_stats',
    body: { prompt: 'a', max_tokens: 1, stream: true, stream_options: { continuous_usage_stats: true, include_usage: false } },
    accept: (p) => (assert.equal(p.engineBody.stream_options, { include_usage: true, continuous_usage_stats: true }), assert.is(p.clientWantsUsage, false)),
  },

  // Model resolution.
  { name: 'model: omitted is the default', body: { prompt: 'a', max_tokens: 1 }, accept: (p) => (assert.is(p.model.id, 'ref-byte'), assert.is(p.engineBody.model, 'svc/ref-byte-4l-64d-dummy')) },
  { name: 'model: null is the default', body: { model: null, prompt: 'a', max_tokens: 1 }, accept: (p) => assert.is(p.model.id, 'ref-byte') },
  { name: 'model: named', body: { model: 'ref-gpt2', prompt: 'a', max_tokens: 1 }, accept: (p) => assert.is(p.engineBody.model, 'svc/ref-gpt2vocab-2l-64d-dummy') },
  { name: 'model: staging is served when named', body: { model: 'byte-staging', prompt: 'a', max_tokens: 1 }, accept: (p) => assert.is(p.model.id, 'byte-staging') },
  {
    name: 'model: unknown id lists the live ids',
    body: { model: 'gpt-4', prompt: 'a', max_tokens: 1 },
    reject: { status: 400, code: 'model_not_found', message: 'available models: ref-byte, ref-gpt2, byte-nolen, byte-big, byte-lp5, byte-noact, byte-layers-unknown' },
  },
  { name: 'model: repository name is not an id', body: { model: 'svc/ref-byte-4l-64d-dummy', prompt: 'a' }, reject: { status: 400, code: 'model_not_found' } },
  { name: 'model: number', body: { model: 5, prompt: 'a' }, reject: bad('model: must be a model id string or null') },
  { name: 'user: string (not forwarded)', body: { prompt: 'a', max_tokens: 1, user: 'team-a' }, accept: (p) => (assert.is(p.user, 'team-a'), assert.not.ok('user' in p.engineBody)) },
  { name: 'user: number', body: { prompt: 'a', max_tokens: 1, user: 5 }, reject: bad('user: must be a string or null') },

  // Pre-flight: tokenizer.
  {
    name: 'tokenizer not loaded: 503 with Retry-After',
    body: { model: 'ref-hf', prompt: 'a', max_tokens: 1 },
    ctx: { registry: brokenRegistry },
    reject: { status: 503, code: 'tokenizer_unavailable', headers: { 'retry-after': /^(35[6-9]\d|3600)$/ } }, // seconds until the next try: an hour, less the time since it failed
  },
  { name: 'tokenizer not loaded: other models unaffected', body: { prompt: 'a', max_tokens: 1 }, ctx: { registry: brokenRegistry }, accept: ok() },

  // Pre-flight: context length.
  { name: 'context: 768 + 32,000 = max_model_len', body: { prompt: x(767), max_tokens: 32_000, stream: true }, accept: (p) => assert.equal(p.promptTokenCounts, [768]) },
  {
    name: 'context: 769 + 32,000 = max_model_len + 1',
    body: { prompt: x(768), max_tokens: 32_000, stream: true },
    reject: { status: 400, code: 'context_length_exceeded', message: 'prompt: 769 prompt tokens + max_tokens 32000 = 32769 exceeds the context length 32768 of model ref-byte' },
  },
  { name: 'context: add_special_tokens false counts no BOS', body: { prompt: x(768), max_tokens: 32_000, stream: true, add_special_tokens: false }, accept: (p) => (assert.equal(p.promptTokenCounts, [768]), assert.is(p.engineBody.add_special_tokens, false)) },
  { name: 'context: token ids 1048 + 1000 = 2048', body: { model: 'ref-gpt2', prompt: ids(1048), max_tokens: 1000 }, accept: ok() },
  { name: 'context: token ids 1049 + 1000', body: { model: 'ref-gpt2', prompt: ids(1049), max_tokens: 1000 }, reject: { status: 400, code: 'context_length_exceeded', message: /^prompt: 1049 prompt tokens/ } },
  { name: 'context: batch judged on its longest prompt, named', body: { model: 'ref-gpt2', prompt: [ids(10), ids(1049), ids(5)], max_tokens: 1000 }, reject: { status: 400, code: 'context_length_exceeded', message: /^prompt\[1\]: 1049 prompt tokens/ } },
  { name: 'context: text batch at the limit', body: { prompt: ['a', x(16_767)], max_tokens: 16_000, stream: true }, accept: (p) => assert.equal(p.promptTokenCounts, [2, 16_768]) },
  { name: 'context: text batch over the limit', body: { prompt: ['a', x(16_768)], max_tokens: 16_000, stream: true }, reject: { status: 400, code: 'context_length_exceeded', message: /^prompt\[1\]: 16769 prompt tokens/ } },
  { name: 'context: r50k text counted by the real tokenizer', body: { model: 'ref-gpt2', prompt: 'hello world', max_tokens: 2045 }, accept: (p) => assert.equal(p.promptTokenCounts, [3]) },
  { name: 'context: r50k text one over', body: { model: 'ref-gpt2', prompt: 'hello world', max_tokens: 2046 }, reject: { status: 400, code: 'context_length_exceeded' } },
  { name: 'context: skipped when max_model_len is null', body: { model: 'byte-nolen', prompt: x(40_000), max_tokens: 100 }, accept: ok() },

  // Pre-flight: full vocabulary.
  { name: 'full vocab: 1024 prompt tokens', body: { prompt: x(1023), max_tokens: 1, prompt_logprobs: -1 }, accept: (p) => assert.ok(p.fullVocab) },
  {
    name: 'full vocab: 1025 prompt tokens',
    body: { prompt: x(1024), max_tokens: 1, prompt_logprobs: -1 },
    reject: { status: 400, code: 'full_vocab_prompt_too_long', message: 'prompt: 1025 tokens is longer than the 1024 tokens allowed with prompt_logprobs -1' },
  },
  { name: 'full vocab: batch names the prompt', body: { prompt: [ids(3), ids(1025)], max_tokens: 1, prompt_logprobs: -1 }, reject: { status: 400, code: 'full_vocab_prompt_too_long', message: /^prompt\[1\]: 1025 tokens/ } },
  { name: 'full vocab: long prompt fine with top-k prompt logprobs', body: { prompt: x(1024), max_tokens: 1, prompt_logprobs: 5 }, accept: (p) => assert.not.ok(p.fullVocab) },

  // Default max_tokens and the deadline.
  { name: 'default: non-streaming cut to the deadline', body: { prompt: 'hello' }, accept: maxIs(FEASIBLE, 'requested=32000,applied=15600,reason=deadline,source=default') },
  { name: 'default: streaming keeps the full default', body: { prompt: 'hello', stream: true }, accept: maxIs(32_000) },
  { name: 'default: remaining context below the deadline', body: { model: 'ref-gpt2', prompt: ids(48) }, accept: maxIs(2000) },
  { name: 'default: remaining context 16,000 cut to 15,600', body: { prompt: x(16_767) }, accept: maxIs(FEASIBLE, 'requested=16000,applied=15600,reason=deadline,source=default') },
  { name: 'default: remaining context 1', body: { model: 'ref-gpt2', prompt: ids(2047) }, accept: maxIs(1) },
  {
    name: 'default: no remaining context',
    body: { model: 'ref-gpt2', prompt: ids(2048) },
    reject: { status: 400, code: 'context_length_exceeded', message: 'prompt: 2048 prompt tokens leave no room to generate within the context length 2048 of model ref-gpt2' },
  },
  { name: 'default: unknown context injects 32,000 (streaming)', body: { model: 'byte-nolen', prompt: x(40_000), stream: true }, accept: maxIs(32_000) },
  { name: 'default: unknown context, non-streaming', body: { model: 'byte-nolen', prompt: 'a' }, accept: maxIs(FEASIBLE, 'requested=32000,applied=15600,reason=deadline,source=default') },
  { name: 'deadline: explicit 15,600', body: { prompt: 'a', max_tokens: FEASIBLE }, accept: maxIs(FEASIBLE) },
  {
    name: 'deadline: explicit 15,601',
    body: { prompt: 'a', max_tokens: FEASIBLE + 1 },
    reject: { status: 400, code: 'deadline_infeasible', message: 'max_tokens: 15601 cannot finish within the 14-minute non-streaming request window (at most 15600 tokens at 20 tokens/s)', headers: { 'x-should-retry': 'false' } },
  },
  { name: 'deadline: streaming is not windowed', body: { prompt: 'a', max_tokens: FEASIBLE + 1, stream: true }, accept: maxIs(FEASIBLE + 1) },
  { name: 'deadline: short window, explicit 26', body: { prompt: 'a', max_tokens: 26 }, ctx: { requestWindowMs: 1400 }, accept: maxIs(26) },
  { name: 'deadline: short window, explicit 27', body: { prompt: 'a', max_tokens: 27 }, ctx: { requestWindowMs: 1400 }, reject: { status: 400, code: 'deadline_infeasible', message: 'within the 1400 ms non-streaming request window (at most 26 tokens at 20 tokens/s)' } },
  { name: 'deadline: short window cuts the default', body: { prompt: 'a' }, ctx: { requestWindowMs: 1400 }, accept: maxIs(26, 'requested=32000,applied=26,reason=deadline,source=default') },

  // Activations: capture.
  {
    name: 'capture: true',
    body: { prompt: 'a', max_tokens: 3, output_residual_stream: true },
    accept: (p) => (assert.ok(p.capture), assert.is(p.captureLayerCount, 4), assert.equal(p.engineBody.vllm_xargs, { output_residual_stream: 'true' })),
  },
  {
    name: 'capture: layers deduplicated and sorted',
    body: { prompt: 'a', max_tokens: 3, output_residual_stream: [3, 1, 1] },
    accept: (p) => (assert.is(p.captureLayerCount, 2), assert.equal(p.engineBody.vllm_xargs, { output_residual_stream: '[1,3]' })),
  },
  { name: 'capture: false', body: { prompt: 'a', max_tokens: 3, output_residual_stream: false }, accept: (p) => (assert.not.ok(p.capture), assert.not.ok('vllm_xargs' in p.engineBody)) },
  { name: 'capture: []', body: { prompt: 'a', max_tokens: 3, output_residual_stream: [] }, reject: bad('output_residual_stream: must be true, false or a non-empty list of non-negative integer layer indices') },
  { name: 'capture: [-1]', body: { prompt: 'a', max_tokens: 3, output_residual_stream: [-1] }, reject: bad('output_residual_stream[0]: must be >= 0') },
  { name: 'capture: [1.5]', body: { prompt: 'a', max_tokens: 3, output_residual_stream: [1.5] }, reject: bad('output_residual_stream[0]: must be an integer') },
  { name: 'capture: "all"', body: { prompt: 'a', max_tokens: 3, output_residual_stream: 'all' }, reject: bad('output_residual_stream: must be true, false') },
  { name: 'capture: with stream', body: { prompt: 'a', max_tokens: 3, stream: true, output_residual_stream: true }, reject: bad('output_residual_stream: capture requests cannot stream') },
  { name: 'capture: batch', body: { prompt: ['a', 'b'], max_tokens: 3, output_residual_stream: true }, reject: bad('output_residual_stream: activation capture needs a single prompt with n = 1') },
  { name: 'capture: token-id batch of one', body: { prompt: [[1, 2]], max_tokens: 3, output_residual_stream: true }, accept: (p) => assert.is(p.promptCount, 1) },
  { name: 'capture: n = 2', body: { prompt: 'a', n: 2, max_tokens: 3, output_residual_stream: true }, reject: bad('needs a single prompt with n = 1 (prompt_count 1, n 2)') },
  { name: 'capture: largest layer', body: { prompt: 'a', max_tokens: 3, output_residual_stream: [0, 3] }, accept: ok() },
  { name: 'capture: layer = n_layers', body: { prompt: 'a', max_tokens: 3, output_residual_stream: [0, 4] }, reject: bad('output_residual_stream[1]: layer 4 is out of range (the model has layers 0..3)') },
  { name: 'capture: layer count unknown, the engine decides', body: { model: 'byte-layers-unknown', prompt: 'a', max_tokens: 3, output_residual_stream: [99] }, accept: ok() },
  { name: 'capture: model without activations', body: { model: 'byte-noact', prompt: 'a', max_tokens: 3, output_residual_stream: true }, reject: { status: 400, code: 'activations_unsupported', message: 'output_residual_stream: model byte-noact has no activation engine' } },
  { name: 'capture: false on a model without activations', body: { model: 'byte-noact', prompt: 'a', max_tokens: 3, output_residual_stream: false }, accept: ok() },
  // Capture length: positions = prompt + max_tokens - 1.
  { name: 'capture cap: all 4 layers, 8192 positions', body: { prompt: x(8191), max_tokens: 1, output_residual_stream: true }, accept: ok() },
  {
    name: 'capture cap: all 4 layers, 8193 positions',
    body: { prompt: x(8192), max_tokens: 1, output_residual_stream: true },
    reject: { status: 400, code: 'activation_prompt_too_long', message: 'output_residual_stream: capturing all layers of model ref-byte allows 8192 positions (prompt tokens + max_tokens - 1); this request needs 8193' },
  },
  { name: 'capture cap: 2 of 4 layers, 16,384 positions', body: { prompt: x(15_999), max_tokens: 385, output_residual_stream: [0, 1] }, accept: ok() },
  { name: 'capture cap: 2 of 4 layers, 16,385 positions', body: { prompt: x(15_999), max_tokens: 386, output_residual_stream: [1, 0, 1] }, reject: { status: 400, code: 'activation_prompt_too_long', message: 'capturing 2 layer(s) of model ref-byte allows 16384 positions' } },
  { name: 'capture cap: clamped to max_model_len', body: { model: 'ref-gpt2', prompt: ids(2000), max_tokens: 48, output_residual_stream: [0] }, accept: ok() },
  { name: 'capture cap: clamped default', body: { model: 'ref-gpt2', prompt: ids(1000), output_residual_stream: [0] }, accept: maxIs(1048) },
  { name: 'capture cap: layer count unknown, ratio 1', body: { model: 'byte-layers-unknown', prompt: x(8191), max_tokens: 1, output_residual_stream: [0] }, accept: ok() },
  { name: 'capture cap: layer count unknown, one over', body: { model: 'byte-layers-unknown', prompt: x(8191), max_tokens: 2, output_residual_stream: [0] }, reject: { status: 400, code: 'activation_prompt_too_long' } },
  { name: 'capture cap: default fits the cap', body: { prompt: x(99), output_residual_stream: true }, accept: maxIs(8093) },
  { name: 'capture cap: default of 1 at the cap', body: { prompt: x(8191), output_residual_stream: true }, accept: maxIs(1) },
  { name: 'capture cap: no room for a default', body: { prompt: x(8192), output_residual_stream: true }, reject: { status: 400, code: 'activation_prompt_too_long' } },
  {
    name: 'capture bytes: an omitted max_tokens fits in max_capture_bytes',
    body: { model: 'byte-cap1m', prompt: x(99), output_residual_stream: true },
    accept: (p) => assert.is(p.maxTokens, 1251 - 100 + 1),
  },
  { name: 'capture bytes: the last position that fits', body: { model: 'byte-cap1m', prompt: x(99), max_tokens: 1152, output_residual_stream: true }, accept: (p) => assert.is(p.maxTokens, 1152) },
  {
    name: 'capture bytes: one position over the bound, refused naming it',
    body: { model: 'byte-cap1m', prompt: x(99), max_tokens: 1153, output_residual_stream: true },
    reject: {
      status: 400,
      code: 'activation_prompt_too_long',
      message:
        'output_residual_stream: captures of model byte-cap1m are served up to 1000000 bytes (activations.max_capture_bytes); capturing all layers fits 1251 positions (prompt tokens + max_tokens - 1) in that bound; this request needs 1252',
    },
  },
  { name: 'capture bytes: one layer fits more positions', body: { model: 'byte-cap1m', prompt: x(99), max_tokens: 3883, output_residual_stream: [2] }, accept: (p) => assert.is(p.maxTokens, 3883) },
  { name: 'capture bytes: one layer, one over', body: { model: 'byte-cap1m', prompt: x(99), max_tokens: 3884, output_residual_stream: [2] }, reject: { status: 400, code: 'activation_prompt_too_long', message: 'capturing 1 layer(s) fits 3982 positions' } },
  { name: 'capture cap: steering alone is not capped', body: { prompt: x(9000), max_tokens: 10, apply_steering_vectors: [vec()] }, accept: ok() },

  // Activations: steering.
  {
    name: 'steering: defaults filled, JSON string in vllm_xargs',
    body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [vec([3], { scale: 4 })] },
    accept: (p) => {
      assert.ok(p.steering);
      assert.equal(p.engineBody.vllm_xargs, {
        apply_steering_vectors: `[{"activations":{"data":"${zeros64(256)}","dtype":"float32","shape":[1,64]},"layer_indices":[3],"scale":4,"norm_match":false,"position_indices":null}]`,
      });
    },
  },
  {
    name: 'steering and capture together',
    body: { prompt: 'a', max_tokens: 3, output_residual_stream: [2], apply_steering_vectors: [vec([1], { norm_match: true })] },
    accept: (p) => {
      const xargs = p.engineBody.vllm_xargs as Record<string, string>;
      assert.is(xargs.output_residual_stream, '[2]');
      assert.equal(JSON.parse(xargs.apply_steering_vectors), [{ activations: codec([1, W]), layer_indices: [1], scale: 1, norm_match: true, position_indices: null }]);
    },
  },
  { name: 'steering: worked example of the codec (a model of unknown width)', body: { model: 'byte-width-unknown', prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec({ data: 'AACAPwAAAMAAAAA/AACAPg==', dtype: 'float32', shape: [1, 4] })] }, accept: ok() },
  { name: 'steering: null', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: null }, accept: (p) => (assert.not.ok(p.steering), assert.not.ok('vllm_xargs' in p.engineBody)) },
  { name: 'steering: []', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [] }, reject: bad('apply_steering_vectors: must be a non-empty list of steering vectors, or null') },
  { name: 'steering: 8 vectors', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: Array.from({ length: 8 }, () => vec()) }, accept: ok() },
  { name: 'steering: 9 vectors', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: Array.from({ length: 9 }, () => vec()) }, reject: bad('apply_steering_vectors: at most 8 steering vectors on model ref-byte (got 9)') },
  { name: 'steering: batch (every prompt steered)', body: { prompt: [[1], [2]], max_tokens: 3, apply_steering_vectors: [vec()] }, accept: (p) => assert.ok((p.engineBody.vllm_xargs as Record<string, unknown> | undefined)?.apply_steering_vectors) },
  { name: 'steering: n = 2 (every choice steered)', body: { prompt: 'a', n: 2, max_tokens: 3, apply_steering_vectors: [vec()] }, accept: (p) => assert.ok((p.engineBody.vllm_xargs as Record<string, unknown> | undefined)?.apply_steering_vectors) },
  { name: 'steering: model without activations', body: { model: 'byte-noact', prompt: 'a', max_tokens: 3, apply_steering_vectors: [vec()] }, reject: { status: 400, code: 'activations_unsupported', message: 'apply_steering_vectors: model byte-noact has no activation engine' } },
  { name: 'steering: unknown key on a vector', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [vec([0], { layer: 1 })] }, reject: bad('unknown field: apply_steering_vectors[0].layer') },
  { name: 'steering: unknown key in the codec', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, W], { endian: 'little' }))] }, reject: bad('unknown field: apply_steering_vectors[0].activations.endian') },
  { name: 'steering: missing layer_indices', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [{ activations: codec([1, W]) }] }, reject: bad('apply_steering_vectors[0].layer_indices: is required') },
  { name: 'steering: missing activations', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [{ layer_indices: [0] }] }, reject: bad('apply_steering_vectors[0].activations: is required') },
  { name: 'steering: empty layer_indices', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [vec([0], { layer_indices: [] })] }, reject: bad('apply_steering_vectors[0].layer_indices: must not be an empty list') },
  { name: 'steering: negative layer', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [vec([-1])] }, reject: bad('apply_steering_vectors[0].layer_indices[0]: must be >= 0') },
  { name: 'steering: scale as a string', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [vec([0], { scale: '2' })] }, reject: bad('apply_steering_vectors[0].scale: must be a number') },
  { name: 'steering: norm_match as a number', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [vec([0], { norm_match: 1 })] }, reject: bad('apply_steering_vectors[0].norm_match: must be a boolean') },
  { name: 'steering: largest layer', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [vec([0, 3])] }, accept: ok() },
  { name: 'steering: layer = n_layers', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [vec([0]), vec([1, 4])] }, reject: bad('apply_steering_vectors[1].layer_indices[1]: layer 4 is out of range (the model has layers 0..3)') },
  { name: 'steering: layer count unknown, the engine decides', body: { model: 'byte-layers-unknown', prompt: 'a', max_tokens: 3, apply_steering_vectors: [vec([99])] }, accept: ok() },
  { name: 'steering: len(layer_indices) != shape[0]', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([2, W]), [0])] }, reject: bad('apply_steering_vectors[0].layer_indices: has 1 entries but activations.shape[0] is 2') },
  // The codec envelope.
  { name: 'codec: data of 524,288 characters', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, 1536, W]))] }, accept: (p) => assert.is((p.engineBody.vllm_xargs as Record<string, string>).apply_steering_vectors.length > 524_288, true) },
  { name: 'codec: data of 524,289 characters', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, 1536, W], { data: 'A'.repeat(524_289) }))] }, reject: bad('apply_steering_vectors[0].activations.data: must be at most 524288 characters') },
  { name: 'codec: empty data', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, W], { data: '' }))] }, reject: bad('apply_steering_vectors[0].activations.data: must not be empty') },
  { name: 'codec: not base64', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, W], { data: 'AAAA*AAA' }))] }, reject: bad('apply_steering_vectors[0].activations.data: must be standard base64 text') },
  { name: 'codec: url-safe base64', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, W], { data: 'AAAA_AAA' }))] }, reject: bad('must be standard base64 text') },
  { name: 'codec: unpadded base64', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, W], { data: 'AACAPwAAAMAAAAA/AACAPg' }))] }, reject: bad('apply_steering_vectors[0].activations.data: must be padded standard base64') },
  { name: 'codec: byte length does not match the shape', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, W], { shape: [2, W] }))] }, reject: bad('apply_steering_vectors[0].activations.data: decodes to 256 bytes but shape [2, 64] of float32 needs 512') },
  { name: 'codec: float16 sizes its bytes', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec({ data: zeros64(128), dtype: 'float16', shape: [1, W] })] }, accept: ok() },
  { name: 'codec: bf16 as int16', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec({ data: zeros64(128), dtype: 'int16', original_dtype: 'torch.bfloat16', shape: [1, W], compression: null })] }, accept: ok() },
  { name: 'codec: unknown dtype', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, W], { dtype: 'bfloat16' }))] }, reject: bad('apply_steering_vectors[0].activations.dtype: must be a numpy dtype name') },
  { name: 'codec: original_dtype number', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, W], { original_dtype: 5 }))] }, reject: bad('apply_steering_vectors[0].activations.original_dtype: must be a string or null') },
  { name: 'codec: 1-D shape', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([4]))] }, reject: bad('apply_steering_vectors[0].activations.shape: must have at least 2 items') },
  { name: 'codec: 4-D shape', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, 1, 1, 4]))] }, reject: bad('apply_steering_vectors[0].activations.shape: must have at most 3 items') },
  { name: 'codec: zero dimension', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, W], { shape: [1, 0] }))] }, reject: bad('apply_steering_vectors[0].activations.shape[1]: must be a positive integer') },
  { name: 'codec: fractional dimension', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, W], { shape: [1, 4.5] }))] }, reject: bad('apply_steering_vectors[0].activations.shape[1]: must be a positive integer') },
  { name: 'codec: missing shape', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec({ data: zeros64(256), dtype: 'float32' })] }, reject: bad('apply_steering_vectors[0].activations.shape: is required') },
  { name: 'codec: zstd frame recording its size', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec({ data: zstd256, dtype: 'float32', shape: [1, W], compression: 'zstd' })] }, accept: ok() },
  { name: 'codec: zstd size does not match the shape', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec({ data: zstd256, dtype: 'float32', shape: [2, W], compression: 'zstd' }, [0])] }, reject: bad('apply_steering_vectors[0].activations.data: decompresses to 256 bytes but shape [2, 64] of float32 needs 512') },
  // What an engine would decode: the shape against the model, the frame against the shape.
  { name: 'codec: a 44 KB zstd frame declaring 1 GiB for shape [4, 67108864] (d_model is 64)', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec({ data: rleFrame(2 ** 30).toString('base64'), dtype: 'float32', shape: [4, 67_108_864], compression: 'zstd' }, [0, 1, 2, 3])] }, reject: bad("apply_steering_vectors[0].activations.shape[1]: is 67108864 but model ref-byte's residual stream is 64 wide (d_model)") },
  { name: 'codec: last dimension one over d_model', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, W + 1]))] }, reject: bad("apply_steering_vectors[0].activations.shape[1]: is 65 but model ref-byte's residual stream is 64 wide (d_model)") },
  { name: 'codec: 3-D, last dimension under d_model', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, 2, W - 1]))] }, reject: bad("apply_steering_vectors[0].activations.shape[2]: is 63 but model ref-byte's residual stream is 64 wide (d_model)") },
  { name: 'codec: more layers than the model has', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([5, W]), [0, 0, 1, 2, 3])] }, reject: bad('apply_steering_vectors[0].activations.shape[0]: is 5 but model ref-byte has 4 layers') },
  { name: 'codec: as many layers as the model has', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([4, W]), [0, 1, 2, 3])] }, accept: ok() },
  { name: 'codec: 3-D, more positions than the context', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec({ data: rleFrame(32_769 * W * 4).toString('base64'), dtype: 'float32', shape: [1, 32_769, W], compression: 'zstd' })] }, reject: bad("apply_steering_vectors[0].activations.shape[1]: is 32769 positions but model ref-byte's context is 32768 (max_model_len)") },
  { name: 'codec: 3-D, the whole context', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec({ data: rleFrame(32_768 * W * 4).toString('base64'), dtype: 'float32', shape: [1, 32_768, W], compression: 'zstd' })] }, accept: ok() },
  { name: 'codec: width unknown to the gateway, the engine decides', body: { model: 'byte-width-unknown', prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, 5]))] }, accept: ok() },
  { name: 'codec: a frame of RLE blocks declaring the shape', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec({ data: rleFrame(256).toString('base64'), dtype: 'float32', shape: [1, W], compression: 'zstd' })] }, accept: ok() },
  { name: 'codec: a second frame after the one declaring the shape', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec({ data: Buffer.concat([Buffer.from(zstd256, 'base64'), rleFrame(2 ** 20)]).toString('base64'), dtype: 'float32', shape: [1, W], compression: 'zstd' })] }, reject: bad('apply_steering_vectors[0].activations.data: must be one zstd frame (45 bytes follow it)') },
  { name: 'codec: a frame cut short', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec({ data: rleFrame(4 * W * 4).subarray(0, 15).toString('base64'), dtype: 'float32', shape: [4, W], compression: 'zstd' }, [0, 1, 2, 3])] }, reject: bad('apply_steering_vectors[0].activations.data: the zstd frame is cut short') },
  { name: 'codec: zstd declared, raw bytes sent', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, W], { compression: 'zstd' }))] }, reject: bad('the data is not a zstd frame') },
  { name: 'codec: unknown compression', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, W], { compression: 'gzip' }))] }, reject: bad('apply_steering_vectors[0].activations.compression: must be "zstd" or null') },
  // Positions.
  { name: 'positions: 3-D tensor with shape[1] positions', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, 2, W]), [0], { position_indices: [0, 5] })] }, accept: ok() },
  { name: 'positions: 3-D tensor without positions', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, 2, W]), [0], { position_indices: null })] }, accept: ok() },
  { name: 'positions: with a 2-D tensor', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [vec([0], { position_indices: [0] })] }, reject: bad('apply_steering_vectors[0].position_indices: only allowed with a 3-D activations tensor') },
  { name: 'positions: length != shape[1]', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, 2, W]), [0], { position_indices: [0] })] }, reject: bad('apply_steering_vectors[0].position_indices: has 1 entries but activations.shape[1] is 2') },
  { name: 'positions: []', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, 2, W]), [0], { position_indices: [] })] }, reject: bad('apply_steering_vectors[0].position_indices: must not be an empty list') },
  { name: 'positions: negative', body: { prompt: 'a', max_tokens: 3, apply_steering_vectors: [withCodec(codec([1, 2, W]), [0], { position_indices: [0, -1] })] }, reject: bad('apply_steering_vectors[0].position_indices[1]: must be >= 0') },

  // The engine body.
  {
    name: 'engine body: every sampling default sent explicitly',
    body: { prompt: 'hello', max_tokens: 5 },
    accept: (p) =>
      assert.equal(p.engineBody, {
        model: 'svc/ref-byte-4l-64d-dummy',
        prompt: 'hello',
        max_tokens: 5,
        n: 1,
        temperature: 1,
        top_p: 1,
        top_k: -1,
        min_p: 0,
        presence_penalty: 0,
        frequency_penalty: 0,
        repetition_penalty: 1,
        seed: null,
        stop: null,
        logprobs: null,
        prompt_logprobs: null,
        echo: false,
        add_special_tokens: true,
        stream: false,
      }),
  },
  {
    name: 'engine body: client values forwarded verbatim',
    body: {
      model: 'ref-gpt2', prompt: [[1, 2], [3]], max_tokens: 7, n: 3, temperature: 0.5, top_p: 0.9, top_k: 40, min_p: 0.05,
      presence_penalty: -1.5, frequency_penalty: 1.25, repetition_penalty: 1.1, seed: 42, stop: ['\n\n'], logprobs: 2, prompt_logprobs: 0,
      echo: true, add_special_tokens: false, stream: true, stream_options: { include_usage: true, continuous_usage_stats: true }, user: 'u',
    },
    accept: (p) => {
      assert.equal(p.engineBody, {
        model: 'svc/ref-gpt2vocab-2l-64d-dummy', prompt: [[1, 2], [3]], max_tokens: 7, n: 3, temperature: 0.5, top_p: 0.9, top_k: 40, min_p: 0.05,
        presence_penalty: -1.5, frequency_penalty: 1.25, repetition_penalty: 1.1, seed: 42, stop: ['\n\n'], logprobs: 2, prompt_logprobs: 0,
        echo: true, add_special_tokens: false, stream: true, stream_options: { include_usage: true, continuous_usage_stats: true },
      });
      assert.is(p.promptCount, 2);
      assert.is(p.n, 3);
      assert.equal(p.promptTokenCounts, [2, 1]);
      assert.is(p.workTokens, 3 + 2 * 3 * 7);
      assert.is(p.maxTokensSource, 'client');
      assert.is(p.maxTokensClamped, null);
      assert.not.ok(p.capture || p.steering || p.fullVocab);
    },
  },

  // A later budget step lowers max_tokens.
  {
    name: 'budget: explicit max_tokens lowered',
    body: { prompt: 'hello', max_tokens: 100 },
    accept: (p) => {
      const lowered = lowerMaxTokens(p, 40);
      assert.is(lowered.maxTokensClamped, 'requested=100,applied=40,reason=budget,source=client');
      assert.is(lowered.engineBody.max_tokens, 40);
      assert.is(lowered.workTokens, 6 + 40);
      assert.is(p.engineBody.max_tokens, 100); // the prepared request itself is not changed
      assert.is(lowerMaxTokens(p, 100), p);
      assert.is(lowerMaxTokens(p, 500), p);
    },
  },
  {
    name: 'budget: after the deadline cut',
    body: { prompt: 'hello' },
    accept: (p) => assert.is(lowerMaxTokens(p, 1000).maxTokensClamped, 'requested=32000,applied=1000,reason=deadline+budget,source=default'),
  },
  {
    name: 'budget: a streaming default',
    body: { prompt: 'hello', stream: true },
    accept: (p) => {
      const once = lowerMaxTokens(p, 1000);
      assert.is(once.maxTokensClamped, 'requested=32000,applied=1000,reason=budget,source=default');
      assert.is(lowerMaxTokens(once, 10).maxTokensClamped, 'requested=32000,applied=10,reason=budget,source=default');
    },
  },
];

for (const row of rows) {
  test(row.name, () => {
    const context = { ...ctx, ...row.ctx };
    if (row.reject) {
      let error: unknown;
      let prepared: PreparedCompletion | undefined;
      try {
        prepared = prepareCompletion(row.body, context);
      } catch (err) {
        error = err;
      }
      assert.ok(error instanceof ApiError, `expected ${row.reject.code}, got ${prepared ? 'a prepared completion' : String(error)}`);
      const e = error as ApiError;
      assert.is(e.code, row.reject.code, e.message);
      assert.is(e.status, row.reject.status);
      if (row.reject.message !== undefined) assert.match(e.message, row.reject.message);
      for (const [name, value] of Object.entries(row.reject.headers ?? {})) {
        if (value instanceof RegExp) assert.match(String(e.headers[name]), value);
        else assert.is(e.headers[name], value);
      }
    } else {
      const prepared = prepareCompletion(row.body, context);
      // What the engine receives is exactly what was built: no undefined, NaN, Infinity or non-JSON value.
      assert.equal(JSON.parse(JSON.stringify(prepared.engineBody)), prepared.engineBody, 'the engine body survives JSON unchanged');
      row.accept?.(prepared);
    }
  });
}

test('largest capture per model: over every layer count, within max_capture_bytes', () => {
  // ref-byte: 1 layer x 32,768 positions (max_model_len) x 64 wide is its largest body.
  assert.is(captureBodyBytes(1, 32_768, 64, 64), 4 * Math.ceil((32_768 * 64 * 2) / 3) + 65_536 + 32_768 * 64);
  assert.is(largestCaptureBytes(byteModel, null), captureBodyBytes(1, 32_768, 64, 64));
  assert.is(largestCaptureBytes(gpt2Model, null), captureBodyBytes(2, 2048, 64, 64)); // max_model_len caps one layer at the positions of two
  const capped = largestCaptureBytes(models.find((m) => m.id === 'byte-cap1m')!, null)!;
  assert.ok(capped <= 1_000_000 && capped > 990_000, String(capped));
  assert.is(largestCaptureBytes(models.find((m) => m.id === 'byte-layers-unknown')!, null), null);
  assert.is(largestCaptureBytes(models.find((m) => m.id === 'byte-noact')!, null), null);
});

test('a token at its longest in JSON: whole characters as JSON writes them, any other byte as a U+FFFD', () => {
  const vocabulary = (tokens: number[][]) => ({ vocabSize: tokens.length, tokenBytes: (id: number) => Uint8Array.from(tokens[id]) }) as unknown as Tokenizer;
  const utf8 = (text: string) => [...Buffer.from(text)];
  assert.is(tokenTextJsonBytes(vocabulary([utf8('abc')])), 3);
  assert.is(tokenTextJsonBytes(vocabulary([utf8('a'), [0x01, 0x1f]])), 12); // \u0001\u001f
  assert.is(tokenTextJsonBytes(vocabulary([utf8('"\\')])), 4); // \" \\
  assert.is(tokenTextJsonBytes(vocabulary([utf8('é€😀')])), 2 + 3 + 4); // whole: their own bytes
  assert.is(tokenTextJsonBytes(vocabulary([[0xe2, 0x82]])), 6); // the start of a "€": each byte may become a U+FFFD
  assert.is(tokenTextJsonBytes(vocabulary([[0x82, 0xac, 0x41]])), 7); // its end, then "A"
  assert.is(tokenTextJsonBytes(vocabulary([[0xed, 0xa0, 0x80]])), 9); // a surrogate's encoding is not UTF-8
  assert.is(tokenTextJsonBytes(vocabulary([[0xc0, 0xaf]])), 6); // nor an overlong one
  // The reference models: GPT-2's longest token in JSON is 128 bytes; ref-byte's stay under the 64-byte floor.
  assert.is(tokenTextJsonBytes(registry.tokenizer('ref-gpt2')), 128);
  assert.is(captureBytesPerPosition(registry.tokenizer('ref-gpt2')), 128);
  assert.is(captureBytesPerPosition(registry.tokenizer('ref-byte')), 64);
  assert.is(captureBytesPerPosition(null), 64);
  assert.is(largestCaptureBytes(gpt2Model, registry.tokenizer('ref-gpt2')), captureBodyBytes(2, 2048, 64, 128));
  assert.is(largestCaptureBytes(byteModel, registry.tokenizer('ref-byte')), captureBodyBytes(1, 32_768, 64, 64));
});

test('deadline-feasible tokens: 14 minutes at 20 tokens/s is 15,600', () => {
  assert.is(deadlineFeasibleTokens(14 * 60_000, 20), 15_600);
  assert.is(deadlineFeasibleTokens(1400, 20), 26);
  assert.is(formatMaxTokensClamped(10, 5, 'deadline+budget', 'client'), 'requested=10,applied=5,reason=deadline+budget,source=client');
});

test('an injected default on a model of unknown context is sized to the context its engine reports', () => {
  // Non-streaming: the default (32,000) was cut to the deadline figure; the engine's 2,048 leaves 2,042 after a 6-token prompt.
  const cut = prepareCompletion({ model: 'byte-nolen', prompt: 'hello' }, ctx);
  assert.ok(needsEngineContextLength(cut));
  assert.is(cut.maxTokens, FEASIBLE);
  const fitted = fitDefaultToContext(cut, 2048);
  assert.is(fitted.maxTokens, 2042);
  assert.is(fitted.engineBody.max_tokens, 2042);
  assert.is(fitted.maxTokensRequested, 2042);
  assert.is(fitted.maxTokensClamped, null, 'no cut left: the context-sized default fits the window');
  assert.is(fitted.workTokens, 6 + 2042);
  // A context larger than the deadline figure keeps the cut, now naming the context-sized default.
  const big = fitDefaultToContext(cut, 20_000);
  assert.is(big.maxTokens, FEASIBLE);
  assert.is(big.maxTokensClamped, formatMaxTokensClamped(19_994, FEASIBLE, 'deadline', 'default'));
  // Streaming: no deadline; never raised above the contract's 32,000.
  const streamed = prepareCompletion({ model: 'byte-nolen', prompt: 'hello', stream: true }, ctx);
  assert.is(fitDefaultToContext(streamed, 1_000_000), streamed);
  assert.is(fitDefaultToContext(streamed, 100).maxTokens, 94);
  // A prompt that fills the engine's context leaves no room.
  try {
    fitDefaultToContext(streamed, 6);
    assert.unreachable();
  } catch (error) {
    assert.is((error as ApiError).code, 'context_length_exceeded');
  }
  // Known contexts and explicit max_tokens are left alone.
  const known = prepareCompletion({ prompt: 'hello' }, ctx);
  assert.not.ok(needsEngineContextLength(known));
  assert.is(fitDefaultToContext(known, 10), known);
  const explicit = prepareCompletion({ model: 'byte-nolen', prompt: 'hello', max_tokens: 5000 }, ctx);
  assert.is(fitDefaultToContext(explicit, 10), explicit);
});

test('a prompt a lower bound proves too long is refused before it is tokenized, with the error the count would give', async () => {
  const refusal = (body: Record<string, unknown>) => {
    try {
      prepareCompletion(body, ctx);
    } catch (error) {
      return error as ApiError;
    }
    assert.unreachable(`accepted ${JSON.stringify(body).slice(0, 80)}`);
  };
  const gpt2 = registry.tokenizer('ref-gpt2');
  // GPT-2 (2,048 tokens, at most 128 bytes a token): 300,000 bytes are at least 2,345 tokens with BOS.
  const long = 'x'.repeat(300_000);
  assert.is(gpt2.minTokens(long, true), 2345);
  let error = refusal({ model: 'ref-gpt2', prompt: long, max_tokens: 1 })!;
  assert.is(error.code, 'context_length_exceeded');
  assert.is(error.status, 400);
  assert.is(error.message, 'prompt: at least 2345 prompt tokens + max_tokens 1 = 2346 exceeds the context length 2048 of model ref-gpt2');
  error = refusal({ model: 'ref-gpt2', prompt: long })!;
  assert.is(error.message, 'prompt: at least 2345 prompt tokens leave no room to generate within the context length 2048 of model ref-gpt2');
  // A batch names the prompt with the largest bound.
  error = refusal({ model: 'ref-gpt2', prompt: ['short', long, 'x'.repeat(1000)], max_tokens: 1 })!;
  assert.match(error.message, /^prompt\[1\]: at least 2345 prompt tokens/);
  // With prompt_logprobs -1 and no max_tokens, the full-vocabulary cap is the first check a count would fail.
  error = refusal({ model: 'ref-gpt2', prompt: long, prompt_logprobs: -1 })!;
  assert.is(error.code, 'full_vocab_prompt_too_long');
  assert.match(error.message, /^prompt: at least 2345 tokens is longer than the \d+ tokens allowed/);
  // The byte tokenizer's bound is its count: the message is the counted one.
  error = refusal({ model: 'ref-byte', prompt: 'x'.repeat(40_000), max_tokens: 1 })!;
  assert.is(error.message, 'prompt: 40001 prompt tokens + max_tokens 1 = 40002 exceeds the context length 32768 of model ref-byte');
});

test.after(() => {
  registry.close();
  brokenRegistry.close();
});

test.run();
