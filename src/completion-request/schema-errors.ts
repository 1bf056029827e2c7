// Turns a schema failure into one 400 `invalid_request` whose message names the field. The whole body
// is checked once with the compiled schema; only a failing body pays for this diagnosis.
import { Compile } from 'typebox/compile';
import { Settings } from 'typebox/system';
import type { TSchema } from 'typebox';
import { apiError, type ApiError } from '../errors/index.ts';
import { CODEC_DTYPE_SIZES } from '../codec/index.ts';
import { CompletionRequest } from './schema.ts';

interface SchemaError {
  keyword: string;
  instancePath: string;
  params: Record<string, unknown>;
}

const fieldOrder = Object.keys(CompletionRequest.properties) as (keyof typeof CompletionRequest.properties)[];
const knownFields = new Set<string>(fieldOrder);
const fieldValidators = new Map(
  fieldOrder.map((name) => [name, Compile(CompletionRequest.properties[name] as TSchema)] as const),
);

/** What a union accepts, said once instead of one line per failed branch. */
const unionMessages: Record<string, string> = {
  model: 'must be a model id string or null',
  max_tokens: 'must be an integer from 1 to 1000000, or null',
  top_k: 'must be -1 (disabled) or an integer >= 1',
  seed: 'must be an integer from 0 to 9223372036854775807, or null',
  stop: 'must be a string, a list of at most 4 strings, or null',
  logprobs: 'must be an integer from 0 to 100, or null',
  prompt_logprobs: 'must be -1 (full vocabulary), an integer from 0 to 100, or null',
  stream_options: 'must be an object with the boolean keys include_usage and continuous_usage_stats, or null',
  user: 'must be a string or null',
  output_residual_stream: 'must be true, false or a non-empty list of non-negative integer layer indices',
  apply_steering_vectors: 'must be a non-empty list of steering vectors, or null',
};

const PROMPT_SHAPES = 'a string, a list of strings, a list of token ids, or a list of non-empty token-id lists';

/** The first problem of a body that failed the compiled schema, as an ApiError naming the field. */
export function schemaError(body: unknown): ApiError {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) {
    return invalid('body', 'body: must be a JSON object');
  }
  const record = body as Record<string, unknown>;
  for (const key of Object.keys(record)) {
    if (!knownFields.has(key)) return invalid(key, `unknown field: ${key}`);
  }
  if (record.prompt === undefined) return invalid('prompt', 'prompt: is required');
  for (const name of fieldOrder) {
    const value = record[name];
    if (value === undefined) continue;
    const validator = fieldValidators.get(name)!;
    if (validator.Check(value)) continue;
    if (name === 'prompt') return promptError(value);
    return fieldError(name, allErrors(validator, value));
  }
  return invalid('body', 'body: is invalid');
}

function fieldError(name: string, errors: SchemaError[]): ApiError {
  const relevant = errors.filter((e) => e.keyword !== 'anyOf' && e.keyword !== 'oneOf' && e.keyword !== 'boolean');
  const located = relevant.map((e) => ({ error: e, path: [name, ...pathOf(e)] }));
  const unknown = located.find((l) => l.error.keyword === 'additionalProperties');
  if (unknown) return invalid(name, `unknown field: ${render(unknown.path)}`);
  const depth = Math.max(...located.map((l) => l.path.length));
  const deepest = located.filter((l) => l.path.length === depth);
  const path = deepest[0]?.path ?? [name];
  const field = render(path);
  if (path.length === 1 && unionMessages[name]) return invalid(name, `${field}: ${unionMessages[name]}`);
  const leaf = path[path.length - 1];
  if (leaf === 'dtype') return invalid(name, `${field}: must be a numpy dtype name (${Object.keys(CODEC_DTYPE_SIZES).join(', ')})`);
  if (leaf === 'compression') return invalid(name, `${field}: must be "zstd" or null`);
  const lengthError = deepest.some((l) => l.error.keyword === 'minLength' || l.error.keyword === 'maxLength');
  if (leaf === 'data' && !lengthError && deepest.some((l) => l.error.keyword === 'pattern')) {
    return invalid(name, `${field}: must be standard base64 text`);
  }
  if (path.length > 1 && path[path.length - 2] === 'shape' && /^\d+$/.test(leaf)) {
    return invalid(name, `${field}: must be a positive integer`);
  }
  const errs = deepest.map((l) => l.error);
  const bound = errs.find((e) => e.keyword !== 'type' && e.keyword !== 'const');
  if (bound) return invalid(name, `${field}: ${describe(bound)}`);
  const types = [...new Set(errs.map((e) => describe(e)))];
  return invalid(name, `${field}: ${types.join(' or ').replace(/ or must be /g, ' or ')}`);
}

function describe(e: SchemaError): string {
  const p = e.params as Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any
  switch (e.keyword) {
    case 'type':
      return `must be ${article(String(p.type))}`;
    case 'const':
      return `must be ${JSON.stringify(p.allowedValue)}`;
    case 'minimum':
    case 'maximum':
    case 'exclusiveMinimum':
    case 'exclusiveMaximum':
      return `must be ${p.comparison} ${p.limit}`;
    case 'minItems':
      return p.limit === 1 ? 'must not be an empty list' : `must have at least ${p.limit} items`;
    case 'maxItems':
      return `must have at most ${p.limit} items`;
    case 'minLength':
      return p.limit === 1 ? 'must not be empty' : `must be at least ${p.limit} characters`;
    case 'maxLength':
      return `must be at most ${p.limit} characters`;
    case 'required':
      return 'is required';
    default:
      return 'is invalid';
  }
}

function article(type: string): string {
  if (type === 'null') return 'null';
  return /^[aeiou]/.test(type) ? `an ${type}` : `a ${type}`;
}

/** Why a prompt fails: the accepted shapes, and where the given one goes wrong. */
function promptError(value: unknown): ApiError {
  if (!Array.isArray(value)) return invalid('prompt', `prompt: must be ${PROMPT_SHAPES}`);
  if (value.length === 0) return invalid('prompt', 'prompt: must not be an empty list');
  const kinds = new Set(value.map((item) => (typeof item === 'string' ? 'string' : typeof item === 'number' ? 'number' : Array.isArray(item) ? 'array' : 'other')));
  const other = value.findIndex((item) => typeof item !== 'string' && typeof item !== 'number' && !Array.isArray(item));
  if (other >= 0) return invalid('prompt', `prompt[${other}]: must be a string, a token id or a list of token ids (prompt must be ${PROMPT_SHAPES})`);
  if (kinds.size > 1) return invalid('prompt', `prompt: mixed lists are not accepted; prompt must be ${PROMPT_SHAPES}`);
  if (kinds.has('number')) {
    const bad = value.findIndex((id) => !isTokenId(id));
    return invalid('prompt', `prompt[${bad}]: token ids must be non-negative integers`);
  }
  for (let i = 0; i < value.length; i++) {
    const inner = value[i] as unknown[];
    if (inner.length === 0) return invalid('prompt', `prompt[${i}]: a token-id prompt must not be empty`);
    const bad = inner.findIndex((id) => !isTokenId(id));
    if (bad >= 0) return invalid('prompt', `prompt[${i}][${bad}]: token ids must be non-negative integers`);
  }
  return invalid('prompt', `prompt: must be ${PROMPT_SHAPES}`);
}

function isTokenId(id: unknown): boolean {
  return typeof id === 'number' && Number.isInteger(id) && id >= 0;
}

function allErrors(validator: ReturnType<typeof Compile>, value: unknown): SchemaError[] {
  const settings = Settings.Get();
  const previous = settings.maxErrors;
  Settings.Set({ maxErrors: 64 }); // union diagnosis needs every branch's errors; restored before returning
  try {
    return validator.Errors(value) as SchemaError[];
  } finally {
    Settings.Set({ maxErrors: previous });
  }
}

function pathOf(e: SchemaError): string[] {
  const parts = e.instancePath.split('/').slice(1).map((p) => p.replace(/~1/g, '/').replace(/~0/g, '~'));
  const p = e.params as { additionalProperties?: string[]; requiredProperties?: string[] };
  if (e.keyword === 'additionalProperties' && p.additionalProperties?.length) parts.push(p.additionalProperties[0]);
  if (e.keyword === 'required' && p.requiredProperties?.length) parts.push(p.requiredProperties[0]);
  return parts;
}

/** `['apply_steering_vectors', '0', 'layer_indices']` -> `apply_steering_vectors[0].layer_indices`. */
export function render(path: readonly string[]): string {
  return path.reduce((acc, p) => (/^\d+$/.test(p) ? `${acc}[${p}]` : acc ? `${acc}.${p}` : p), '');
}

export function invalid(param: string, message: string): ApiError {
  return apiError('invalid_request', message, { fields: { param } });
}
