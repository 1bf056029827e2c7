import { Type, type Static } from 'typebox';

/** How a model's text becomes token ids; the gateway and the reference engine share one tokenizer module. */
export const TokenizerSpec = Type.Union([
  Type.Object({ kind: Type.Literal('byte') }, { additionalProperties: false }),
  Type.Object({ kind: Type.Literal('r50k_base') }, { additionalProperties: false }),
  Type.Object({ kind: Type.Literal('hf'), path: Type.String({ minLength: 1 }) }, { additionalProperties: false }),
]);
export type TokenizerSpec = Static<typeof TokenizerSpec>;

/** Sizes of the reference engine's dummy-weight transformer. */
export const Architecture = Type.Object(
  {
    n_layers: Type.Integer({ minimum: 1, maximum: 256 }),
    d_model: Type.Integer({ minimum: 8 }),
    n_heads: Type.Integer({ minimum: 1 }),
    d_mlp: Type.Integer({ minimum: 8 }),
    seed: Type.Integer({ minimum: 0 }),
  },
  { additionalProperties: false },
);
export type Architecture = Static<typeof Architecture>;

export const Capabilities = Type.Object(
  {
    max_model_len: Type.Union([Type.Integer({ minimum: 1 }), Type.Null()]),
    max_logprobs: Type.Integer({ minimum: 0, maximum: 100 }),
    prompt_logprobs_full_vocab: Type.Boolean(),
    full_vocab_max_prompt_tokens: Type.Integer({ minimum: 1 }),
    max_output_work_tokens: Type.Integer({ minimum: 1 }),
    max_inflight_per_key: Type.Integer({ minimum: 1 }),
    max_queued_per_key: Type.Integer({ minimum: 0 }),
    rate_limit_per_minute: Type.Integer({ minimum: 1 }),
  },
  { additionalProperties: false },
);
export type Capabilities = Static<typeof Capabilities>;

export const ActivationSupport = Type.Object(
  {
    /** Layer count when known; steering and capture layers are then range-checked by the gateway. */
    n_layers: Type.Union([Type.Integer({ minimum: 1 }), Type.Null()]),
    max_steering_vectors: Type.Integer({ minimum: 1, maximum: 8 }),
    /** Prompt + max_tokens - 1 positions allowed when every layer is captured; scaled up for fewer layers. */
    max_activation_prompt_tokens: Type.Integer({ minimum: 1 }),
    /** Width of the residual stream; defaults to architecture.d_model. Needed to size captures in bytes. */
    d_model: Type.Optional(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()])),
    /**
     * Largest capture response (bytes) this gateway serves for the model, when memory says less than the
     * other limits admit; the pre-flight refuses a capture whose body could exceed it (400, before any engine work).
     */
    max_capture_bytes: Type.Optional(Type.Integer({ minimum: 1 })),
    /**
     * How the model's engine sends captures: "zstd" (one frame at level 1, then base64, as vLLM with
     * vllm-lens does by default) or "none". The reference engine follows it (default "none"); the gateway
     * reads either from any engine, so for a vLLM engine it only documents what that engine does.
     */
    capture_compression: Type.Optional(Type.Union([Type.Literal('zstd'), Type.Literal('none')])),
  },
  { additionalProperties: false },
);
export type ActivationSupport = Static<typeof ActivationSupport>;

/** What a short model id may look like (configuration and the status route's path parameter). */
export const modelIdPattern = '^[A-Za-z0-9._-]{1,64}$';

export const ModelConfig = Type.Object(
  {
    id: Type.String({ pattern: modelIdPattern }),
    default: Type.Optional(Type.Boolean()),
    status: Type.Optional(Type.Union([Type.Literal('live'), Type.Literal('staging')])),
    /** The checkpoint name the engine serves; responses name it in `model`. */
    checkpoint: Type.String({ minLength: 1 }),
    /** `reference` runs the project's CPU engine as a child process; otherwise the engine's base URL. */
    engine: Type.String({ minLength: 1 }),
    gpu_shape: Type.String({ minLength: 1 }),
    cost_per_second: Type.Number({ minimum: 0 }),
    tokenizer: TokenizerSpec,
    architecture: Type.Optional(Architecture),
    capabilities: Capabilities,
    activations: Type.Optional(Type.Union([ActivationSupport, Type.Null()])),
  },
  { additionalProperties: false },
);
export type ModelConfig = Static<typeof ModelConfig>;

export const ServiceConfig = Type.Object(
  {
    models: Type.Array(ModelConfig, { minItems: 1 }),
  },
  { additionalProperties: false },
);
export type ServiceConfig = Static<typeof ServiceConfig>;
