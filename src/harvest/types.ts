/** What the harvest folder shares between its face, its service, its worker and its routes. */
import type { KeyBudgetValues } from '../keys/index.ts';
import type { HarvestShard } from '../../events/harvest.ts';

/** The job kind on the dispatch transport. */
export const harvestWorkKind = 'harvest';

/** The caller of a harvest route: the authenticated key, as the service needs it. */
export interface HarvestCaller {
  readonly keyId: string;
  readonly prefix: string;
  readonly userId: string;
  readonly email: string;
  readonly budgets: KeyBudgetValues;
}

/** The harvest request body (the contract's, validated by the route's schema). */
export interface HarvestRequest {
  model: string;
  prompts: string[];
  layers?: number[] | 'all' | null;
  shard_size?: number;
  batch_size?: number | null;
}

export type HarvestStatus = 'pending' | 'running' | 'succeeded' | 'failed' | 'cancelled';

/** A shard record (events/harvest.ts's HarvestShard) as the job shows it: `index` for `shard`, and its download path. */
export type HarvestShardView = { index: number; /** Path of its download under the base URL; needs the same key (or one of the same user). */ url: string } & Omit<HarvestShard, 'shard'>;

/** A job as `GET /v1/harvest/{job_id}` shows it. */
export interface HarvestJobView {
  id: string;
  job_id: string;
  object: 'harvest.job';
  status: HarvestStatus;
  model: string;
  checkpoint: string;
  layers: number[];
  shard_size: number;
  batch_size: number;
  created_at: string;
  started_at: string | null;
  finished_at: string | null;
  progress: {
    shards_done: number;
    shards_total: number;
    prompts_done: number;
    prompts_total: number;
    tokens_done: number;
    bytes_done: number;
  };
  error: { code: string; message: string } | null;
  /** When a failed or cancelled job's files were removed (DELETE, or the retention); null while kept. */
  files_removed_at: string | null;
  /** On success: the manifest (as stored in `manifest.json`) and a download per shard. */
  result: {
    manifest: unknown;
    manifest_sha256: string;
    shards: HarvestShardView[];
    /** stats.safetensors: its download path, name, size and hash (null for a job finished before statistics were kept). */
    stats: { url: string; file: string; bytes: number; sha256: string } | null;
  } | null;
}
