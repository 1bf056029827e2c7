/** A job's state as the API shows it (`GET /v1/harvest/{job_id}`), its succeeded result read from its manifest. */
import type { HarvestState, ShardRecord } from '../../deciders/index.ts';
import type { HarvestStorage } from './storage.ts';
import type { HarvestJobView, HarvestShardView, HarvestStatus } from './types.ts';

export async function jobView(state: HarvestState, storage: HarvestStorage): Promise<HarvestJobView> {
  const job = state.job!;
  const shards = state.shards.map((record) => shardView(job.job_id, record));
  let result: HarvestJobView['result'] = null;
  if (state.status === 'succeeded') {
    const manifest = await storage.readManifest(job.job_id).catch(() => null);
    const stats = manifest?.manifest.stats;
    result = {
      manifest: manifest?.manifest ?? null,
      manifest_sha256: manifest?.sha256 ?? '',
      shards,
      stats: stats ? { url: `/v1/harvest/${job.job_id}/stats`, file: stats.file, bytes: stats.bytes, sha256: stats.sha256 } : null,
    };
  }
  return {
    id: job.job_id,
    job_id: job.job_id,
    object: 'harvest.job',
    status: state.status as HarvestStatus,
    model: job.model,
    checkpoint: job.checkpoint,
    layers: job.layers,
    shard_size: job.shard_size,
    batch_size: job.batch_size,
    created_at: job.at,
    started_at: state.startedAt,
    finished_at: state.finishedAt,
    progress: {
      shards_done: shards.length,
      shards_total: job.shard_count,
      prompts_done: shards.reduce((n, s) => n + s.prompt_count, 0),
      prompts_total: job.prompt_count,
      tokens_done: shards.reduce((n, s) => n + s.token_count, 0),
      bytes_done: shards.reduce((n, s) => n + s.bytes, 0),
    },
    error: state.error,
    files_removed_at: state.filesRemovedAt,
    result,
  };
}

export function shardView(jobId: string, record: ShardRecord): HarvestShardView {
  return {
    index: record.shard,
    url: `/v1/harvest/${jobId}/shards/${record.shard}`,
    file: record.file,
    first_prompt: record.first_prompt,
    prompt_count: record.prompt_count,
    token_count: record.token_count,
    bytes: record.bytes,
    sha256: record.sha256,
  };
}
