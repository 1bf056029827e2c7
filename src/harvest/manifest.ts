// A harvest's manifest.json, written last: its presence means the job finished whole. It lists every
// shard with its prompt range, token count, size and sha256, in shard order.
import { Type, type Static } from 'typebox';
import { Compile } from 'typebox/compile';
import { HarvestShardFields, type HarvestShard } from '../../events/harvest.ts';

const Count = Type.Integer({ minimum: 0 });

const { shard: _index, ...shardFields } = HarvestShardFields;
/** A shard record (events/harvest.ts's HarvestShard) as the manifest lists it: `index` for `shard`. */
export const ManifestShard = Type.Object({ index: Count, ...shardFields }, { additionalProperties: false });
export type ManifestShard = Static<typeof ManifestShard>;

/** The job's statistics (stats.safetensors) as the manifest describes them. */
export const ManifestStats = Type.Object(
  {
    file: Type.String({ minLength: 1 }),
    bytes: Count,
    sha256: Type.String({ pattern: '^[0-9a-f]{64}$' }),
    token_count: Count,
    mean_token_norm: Type.Array(Type.Union([Type.Number(), Type.Null()])),
  },
  { additionalProperties: false },
);
export type ManifestStats = Static<typeof ManifestStats>;

export const HarvestManifest = Type.Object(
  {
    job_id: Type.String({ minLength: 1 }),
    model: Type.String(),
    checkpoint: Type.String(),
    layers: Type.Array(Count),
    d_model: Type.Union([Count, Type.Null()]),
    dtype: Type.Literal('bf16'),
    prompt_count: Count,
    token_count: Count,
    bytes: Count,
    shards: Type.Array(ManifestShard),
    /** Absent from manifests written before statistics were kept. */
    stats: Type.Optional(ManifestStats),
    created_at: Type.String(),
  },
  { additionalProperties: false },
);
export type HarvestManifest = Static<typeof HarvestManifest>;

const checkManifest = Compile(HarvestManifest);

/** The job's facts the manifest repeats (a HarvestSubmitted's fields). */
export interface ManifestJob {
  job_id: string;
  model: string;
  checkpoint: string;
  layers: readonly number[];
  d_model: number | null;
}

/**
 * The manifest of a job from its state: every shard recorded, in order from 0, covering the prompts
 * without a gap. `dModel` fills in a width the job did not know when submitted (the pipeline's result).
 */
export function buildManifest(
  state: { readonly job: ManifestJob | null; readonly shards: readonly HarvestShard[] },
  options: { createdAt?: string; dModel?: number | null; stats?: ManifestStats } = {},
): HarvestManifest {
  const { job, shards } = state;
  if (job === null) throw new Error('a manifest needs the submitted job');
  let nextPrompt = 0;
  shards.forEach((s, i) => {
    if (s.shard !== i) throw new Error(`the manifest needs shards 0..${shards.length - 1} in order; found shard ${s.shard} at ${i}`);
    if (s.first_prompt !== nextPrompt) throw new Error(`shard ${i} starts at prompt ${s.first_prompt}; the shards before end at ${nextPrompt}`);
    nextPrompt += s.prompt_count;
  });
  const sum = (field: 'prompt_count' | 'token_count' | 'bytes') => shards.reduce((n, s) => n + s[field], 0);
  return {
    job_id: job.job_id,
    model: job.model,
    checkpoint: job.checkpoint,
    layers: [...job.layers],
    d_model: job.d_model ?? options.dModel ?? null,
    dtype: 'bf16',
    prompt_count: sum('prompt_count'),
    token_count: sum('token_count'),
    bytes: sum('bytes'),
    shards: shards.map((s) => ({ index: s.shard, file: s.file, first_prompt: s.first_prompt, prompt_count: s.prompt_count, token_count: s.token_count, bytes: s.bytes, sha256: s.sha256 })),
    ...(options.stats ? { stats: options.stats } : {}),
    created_at: options.createdAt ?? new Date().toISOString(),
  };
}

/** The manifest's bytes as stored: indented JSON and a final newline (people read it). */
export function serializeManifest(manifest: HarvestManifest): Buffer {
  return Buffer.from(`${JSON.stringify(manifest, null, 2)}\n`, 'utf8');
}

/** Parses stored manifest text; throws when it is not a manifest. */
export function parseManifest(text: string): HarvestManifest {
  const value: unknown = JSON.parse(text);
  if (!checkManifest.Check(value)) throw new Error('manifest.json does not hold a harvest manifest');
  return value;
}
