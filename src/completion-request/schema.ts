// The completion request body exactly as the contract's tables state it. The same schemas validate
// requests (compiled once in index.ts) and feed the OpenAPI document.
import { Type, type Static } from 'typebox';
import { BASE64_PATTERN, CODEC_DTYPE_SIZES, type CodecDtype } from '../codec/index.ts';

/** Largest seed the contract allows (2^63-1). As a JS number it reads as 2^63, see docs/completions.md (seed). */
export const MAX_SEED = 9223372036854775807;
/** Longest base64 `data` of one steering vector's tensor (characters). */
export const MAX_STEERING_DATA_CHARS = 524_288;

const NonNegativeInteger = (description: string) => Type.Integer({ minimum: 0, description });
const TokenId = NonNegativeInteger('A token id of the model vocabulary.');

export const TensorCodec = Type.Object(
  {
    data: Type.String({
      minLength: 1,
      maxLength: MAX_STEERING_DATA_CHARS,
      pattern: BASE64_PATTERN,
      description: 'Standard padded base64 of the raw little-endian row-major bytes (zstd-compressed first when `compression` is "zstd").',
    }),
    dtype: Type.Enum(Object.keys(CODEC_DTYPE_SIZES) as CodecDtype[], {
      description: 'numpy dtype name of the bytes; bf16 travels as int16 with original_dtype torch.bfloat16.',
    }),
    original_dtype: Type.Optional(
      Type.Union([Type.String({ minLength: 1, maxLength: 64 }), Type.Null()], { description: 'torch dtype name, e.g. torch.bfloat16.' }),
    ),
    shape: Type.Array(Type.Integer({ minimum: 1 }), {
      minItems: 2,
      maxItems: 3,
      description: '(n_layers, d_model) broadcasts to every position; (n_layers, n_positions, d_model) is position-specific.',
    }),
    compression: Type.Optional(
      Type.Union([Type.Literal('zstd'), Type.Null()], { description: 'null or absent: uncompressed; "zstd": one frame recording its content size.' }),
    ),
  },
  { additionalProperties: false, description: 'Tensor codec envelope. The service validates it and bounds its size; it does not decode the tensor.' },
);
export type TensorCodec = Static<typeof TensorCodec>;

export const SteeringVector = Type.Object(
  {
    activations: TensorCodec,
    layer_indices: Type.Array(NonNegativeInteger('A decoder layer index.'), {
      minItems: 1,
      description: 'Layers to steer; its length must equal activations.shape[0].',
    }),
    scale: Type.Optional(Type.Number({ description: 'Scalar multiplier applied before addition. Default 1.0.' })),
    norm_match: Type.Optional(
      Type.Boolean({ description: 'Rescale the steered hidden state to keep the original per-token L2 norm. Default false.' }),
    ),
    position_indices: Type.Optional(
      Type.Union([Type.Array(NonNegativeInteger('An absolute token position.'), { minItems: 1 }), Type.Null()], {
        description: 'Absolute token positions to steer (3-D activations only, length shape[1]); null means all positions.',
      }),
    ),
  },
  { additionalProperties: false, description: 'A steering vector added to the residual stream during generation.' },
);
export type SteeringVector = Static<typeof SteeringVector>;

export const CompletionPrompt = Type.Union(
  [
    Type.String({ description: 'One raw-text prompt.' }),
    Type.Array(Type.String(), { minItems: 1, description: 'A batch of raw-text prompts.' }),
    Type.Array(TokenId, { minItems: 1, description: 'One prompt as token ids.' }),
    Type.Array(Type.Array(TokenId, { minItems: 1 }), { minItems: 1, description: 'A batch of token-id prompts.' }),
  ],
  { description: 'Raw text, a batch of texts, token ids, or a batch of token-id prompts. No chat template is applied.' },
);
export type CompletionPrompt = Static<typeof CompletionPrompt>;

export const StreamOptions = Type.Object(
  {
    include_usage: Type.Optional(Type.Boolean({ description: 'Send a final usage frame (empty choices) before [DONE].' })),
    continuous_usage_stats: Type.Optional(Type.Boolean({ description: 'Carry the running usage on every content frame.' })),
  },
  { additionalProperties: false },
);
export type StreamOptions = Static<typeof StreamOptions>;

export const CompletionRequest = Type.Object(
  {
    model: Type.Optional(
      Type.Union([Type.String(), Type.Null()], {
        description: 'Short model id from GET /v1/models; null or omitted uses the default model.',
      }),
    ),
    prompt: CompletionPrompt,
    max_tokens: Type.Optional(
      Type.Union([Type.Integer({ minimum: 1, maximum: 1_000_000 }), Type.Null()], {
        description: 'Tokens to generate, 1 to 1,000,000. Omitted or null only for a single prompt with n=1: min(32,000, remaining context) is injected.',
      }),
    ),
    n: Type.Optional(Type.Integer({ minimum: 1, maximum: 16, description: 'Independent completions per prompt, 1 to 16. Default 1.' })),
    temperature: Type.Optional(Type.Number({ minimum: 0, maximum: 100, description: '0 to 100; 0 is greedy. Default 1.0.' })),
    top_p: Type.Optional(Type.Number({ exclusiveMinimum: 0, maximum: 1, description: 'Greater than 0, up to 1. Default 1.0.' })),
    top_k: Type.Optional(
      Type.Union([Type.Literal(-1), Type.Integer({ minimum: 1 })], { description: '-1 disables; otherwise 1 or more. Default -1.' }),
    ),
    min_p: Type.Optional(Type.Number({ minimum: 0, maximum: 1, description: '0 to 1; 0 disables. Default 0.0.' })),
    presence_penalty: Type.Optional(Type.Number({ minimum: -2, maximum: 2, description: '-2 to 2. Default 0.0.' })),
    frequency_penalty: Type.Optional(Type.Number({ minimum: -2, maximum: 2, description: '-2 to 2. Default 0.0.' })),
    repetition_penalty: Type.Optional(
      Type.Number({ exclusiveMinimum: 0, maximum: 2, description: 'Greater than 0, up to 2; multiplicative, 1.0 disables. Default 1.0.' }),
    ),
    seed: Type.Optional(
      Type.Union([Type.Integer({ minimum: 0, maximum: MAX_SEED }), Type.Null()], { description: '0 to 2^63-1, or null for random.' }),
    ),
    stop: Type.Optional(
      Type.Union([Type.String(), Type.Array(Type.String(), { maxItems: 4 }), Type.Null()], {
        description: 'At most 4 stop strings; the matched text is excluded from the output.',
      }),
    ),
    logprobs: Type.Optional(
      Type.Union([Type.Integer({ minimum: 0, maximum: 100 }), Type.Null()], {
        description: '0 to 100 (and at most the model\'s max_logprobs); 0 returns each token\'s own logprob only. Null disables.',
      }),
    ),
    prompt_logprobs: Type.Optional(
      Type.Union([Type.Literal(-1), Type.Integer({ minimum: 0, maximum: 100 }), Type.Null()], {
        description: '-1 (full vocabulary, non-streaming only) or 0 to 100. Null disables.',
      }),
    ),
    echo: Type.Optional(Type.Boolean({ description: 'Prepend the prompt to each choice text. Default false.' })),
    stream: Type.Optional(Type.Boolean({ description: 'Answer as a server-sent event stream. Default false.' })),
    stream_options: Type.Optional(Type.Union([StreamOptions, Type.Null()], { description: 'Only with stream true.' })),
    user: Type.Optional(Type.Union([Type.String(), Type.Null()], { description: 'Free-form tag; telemetry only.' })),
    add_special_tokens: Type.Optional(
      Type.Boolean({ description: 'When false the text is tokenized verbatim, with no beginning-of-text token. Default true.' }),
    ),
    output_residual_stream: Type.Optional(
      Type.Union([Type.Boolean(), Type.Array(NonNegativeInteger('A decoder layer index.'), { minItems: 1 })], {
        description: 'true captures every decoder layer; a list captures those layers. Non-streaming only; prompt length is capped per model.',
      }),
    ),
    apply_steering_vectors: Type.Optional(
      Type.Union([Type.Array(SteeringVector, { minItems: 1 }), Type.Null()], {
        description: 'Steering vectors added to the residual stream during generation (at most the model\'s max_steering_vectors).',
      }),
    ),
  },
  { additionalProperties: false, description: 'POST /v1/completions request body.' },
);
export type CompletionRequest = Static<typeof CompletionRequest>;
