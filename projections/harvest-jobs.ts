/**
 * `harvest_jobs` (one row per job) and `harvest_shards` (one row per shard written), from the job
 * streams `harvest-<jobId>`. The rows serve listings, the resumer (pending and running jobs, their
 * leases) and analysts; the job's stream stays the truth a decision reads.
 *
 * Idempotent without a position guard: a submission that finds its row does nothing; every other
 * event writes what it carries only while the row is still pending or running, so a replayed event
 * never moves a finished job back (and a racing terminal state, refused by the decider, never reaches
 * here); a shard row is inserted once and the job's totals are recounted from the shard rows. So
 * replaying a stream's events in order, in any cut into batches, ends on the same rows.
 */
import { defineProjection, toStorableText, type Queryable } from '../src/event-sourcing/index.ts';
import { harvestEvents, type HarvestEvent, type HarvestShard } from '../events/harvest.ts';
import { describeTable } from './table-comments.ts';

const unfinished = `status IN ('pending', 'running')`;

export const harvestJobsProjection = defineProjection<HarvestEvent>({
  name: 'harvest_jobs',
  tables: ['harvest_jobs', 'harvest_shards'],
  events: [harvestEvents],
  async init(db) {
    await db.query(`CREATE TABLE IF NOT EXISTS harvest_jobs (
      job_id text PRIMARY KEY,
      key_id text NOT NULL,
      key_prefix text NOT NULL,
      user_id text NOT NULL,
      model text NOT NULL,
      checkpoint text NOT NULL,
      status text NOT NULL CHECK (status IN ('pending', 'running', 'succeeded', 'failed', 'cancelled')),
      prompt_count integer NOT NULL,
      shard_count integer NOT NULL,
      shard_size integer NOT NULL,
      batch_size integer NOT NULL,
      layers jsonb NOT NULL,
      estimated_tokens bigint NOT NULL,
      shards_done integer NOT NULL DEFAULT 0,
      prompts_done integer NOT NULL DEFAULT 0,
      tokens_done bigint NOT NULL DEFAULT 0,
      bytes_done bigint NOT NULL DEFAULT 0,
      submitted_at timestamptz NOT NULL,
      started_at timestamptz NULL,
      finished_at timestamptz NULL,
      last_progress_at timestamptz NOT NULL,
      worker_id text NULL,
      lease_until timestamptz NULL,
      redispatches integer NOT NULL DEFAULT 0,
      redispatched_at timestamptz NULL,
      error_code text NULL,
      error_message text NULL,
      month date NOT NULL,
      counted boolean NOT NULL,
      manifest_sha256 text NULL
    )`);
    await db.query('CREATE INDEX IF NOT EXISTS harvest_jobs_user_submitted ON harvest_jobs (user_id, submitted_at DESC, job_id DESC)');
    await db.query(`CREATE INDEX IF NOT EXISTS harvest_jobs_unfinished ON harvest_jobs (submitted_at) WHERE ${unfinished}`);
    await db.query(`CREATE TABLE IF NOT EXISTS harvest_shards (
      job_id text NOT NULL,
      shard integer NOT NULL,
      file text NOT NULL,
      first_prompt integer NOT NULL,
      prompt_count integer NOT NULL,
      token_count bigint NOT NULL,
      bytes bigint NOT NULL,
      sha256 text NOT NULL,
      written_at timestamptz NOT NULL,
      PRIMARY KEY (job_id, shard)
    )`);
    await describeTable(db, 'harvest_jobs', 'One row per harvest job (projection harvest_jobs, from the harvest-<job_id> streams): its plan, status, progress, worker lease and outcome. Never a prompt.', {
      job_id: 'Primary key: the job id (hj_...).',
      key_id: 'The key that submitted it (its 12-hex prefix).',
      key_prefix: 'The submitting key\'s public prefix.',
      user_id: 'The owning user: every key of this user may read the job.',
      model: 'The model id.',
      checkpoint: 'The model checkpoint (weights revision) the activations come from, as the registry names it.',
      status: 'pending (accepted, not started), running, succeeded, failed or cancelled (the last three final).',
      prompt_count: 'Prompts in the job.',
      shard_count: 'Shards planned: ceil(prompt_count / shard_size).',
      shard_size: 'Prompts per shard (shard i holds prompts i*shard_size onwards).',
      batch_size: 'Prompts per capture call (resolved).',
      layers: 'The layers captured, resolved and ascending (JSON array of integers).',
      estimated_tokens: 'Characters of the prompts / 4, as the submit check counted them.',
      shards_done: 'Shards written and recorded.',
      prompts_done: 'Prompts in the recorded shards.',
      tokens_done: 'Tokens captured in the recorded shards.',
      bytes_done: 'Bytes of the recorded shard files.',
      submitted_at: 'When the job was accepted.',
      started_at: 'When its compute job was started (NULL while pending).',
      finished_at: 'When it reached a final status; NULL before.',
      last_progress_at: 'The latest of submitted, started and shard written (a job without progress for too long is aged out).',
      worker_id: 'The worker holding the job now (the last one, once finished); NULL when none does.',
      lease_until: 'While running: when the worker\'s claim lapses unless renewed (the resumer redispatches the job after it); NULL when none.',
      redispatches: 'Times the job was dispatched again after its worker was lost.',
      redispatched_at: 'The last redispatch or republish (an unclaimed job published again); NULL if none.',
      error_code: 'Why it failed: start_failed, stale, worker_lost, or the worker\'s code; NULL otherwise.',
      error_message: 'The failure\'s message; NULL otherwise.',
      month: 'The UTC month the job counts against (its first day).',
      counted: 'Whether it counts against that month\'s quota: false only for a job whose start failed.',
      manifest_sha256: 'Once succeeded: sha256 of its manifest.json (hex); else NULL.',
    });
    await describeTable(db, 'harvest_shards', 'One row per shard file a harvest job wrote and recorded (projection harvest_jobs), in plan order.', {
      job_id: 'The job (key, with shard).',
      shard: 'The shard number, from 0.',
      file: 'The shard\'s file name in the job\'s directory (named per worker claim).',
      first_prompt: 'Index of its first prompt in the job\'s input.',
      prompt_count: 'Prompts in the shard.',
      token_count: 'Tokens captured in the shard.',
      bytes: 'The file\'s size in bytes.',
      sha256: 'The file\'s sha256 (hex).',
      written_at: 'When the shard was recorded.',
    });
  },
  handlers: {
    async HarvestSubmitted(event, db) {
      const d = event.data;
      await db.query(
        `INSERT INTO harvest_jobs (job_id, key_id, key_prefix, user_id, model, checkpoint, status, prompt_count, shard_count, shard_size, batch_size, layers,
           estimated_tokens, submitted_at, last_progress_at, month, counted)
         VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7::int, $8::int, $9::int, $10::int, $11::jsonb, $12::bigint, $13::timestamptz, $13::timestamptz, ($14::text || '-01')::date, true)
         ON CONFLICT (job_id) DO NOTHING`,
        [
          d.job_id,
          d.key_id,
          d.key_prefix,
          toStorableText(d.user_id),
          d.model,
          toStorableText(d.checkpoint),
          d.prompt_count,
          d.shard_count,
          d.shard_size,
          d.batch_size,
          JSON.stringify(d.layers),
          d.estimated_tokens,
          d.at,
          d.month,
        ],
      );
    },
    async HarvestStarted(event, db) {
      await db.query(
        `UPDATE harvest_jobs SET status = 'running', started_at = $2::timestamptz, last_progress_at = GREATEST(last_progress_at, $2::timestamptz) WHERE job_id = $1 AND status = 'pending'`,
        [event.data.job_id, event.data.at],
      );
    },
    async HarvestStartFailed(event, db) {
      await db.query(
        `UPDATE harvest_jobs SET status = 'failed', finished_at = $2::timestamptz, error_code = 'start_failed', error_message = $3, counted = false, lease_until = NULL
         WHERE job_id = $1 AND ${unfinished}`,
        [event.data.job_id, event.data.at, toStorableText(event.data.reason)],
      );
    },
    async HarvestClaimed(event, db) {
      await db.query(`UPDATE harvest_jobs SET worker_id = $2, lease_until = $3::timestamptz WHERE job_id = $1 AND status = 'running'`, [
        event.data.job_id,
        toStorableText(event.data.worker_id),
        event.data.lease_until,
      ]);
    },
    async HarvestClaimRenewed(event, db) {
      await db.query(`UPDATE harvest_jobs SET lease_until = $2::timestamptz WHERE job_id = $1 AND status = 'running'`, [event.data.job_id, event.data.lease_until]);
    },
    async HarvestShardWritten(event, db) {
      const d = event.data;
      await db.query(
        `INSERT INTO harvest_shards (job_id, shard, file, first_prompt, prompt_count, token_count, bytes, sha256, written_at)
         VALUES ($1, $2::int, $3, $4::int, $5::int, $6::bigint, $7::bigint, $8, $9::timestamptz)
         ON CONFLICT (job_id, shard) DO NOTHING`,
        [d.job_id, d.shard, toStorableText(d.file), d.first_prompt, d.prompt_count, d.token_count, d.bytes, d.sha256, d.at],
      );
      // Totals recounted from the shard rows (never incremented), so a replayed shard counts once.
      await db.query(
        `UPDATE harvest_jobs j SET shards_done = s.shards, prompts_done = s.prompts, tokens_done = s.tokens, bytes_done = s.bytes,
           last_progress_at = GREATEST(j.last_progress_at, $2::timestamptz),
           lease_until = CASE WHEN j.status = 'running' THEN $3::timestamptz ELSE j.lease_until END
         FROM (SELECT count(*)::int AS shards, coalesce(sum(prompt_count), 0)::int AS prompts, coalesce(sum(token_count), 0)::bigint AS tokens, coalesce(sum(bytes), 0)::bigint AS bytes
               FROM harvest_shards WHERE job_id = $1) s
         WHERE j.job_id = $1`,
        [d.job_id, d.at, d.lease_until],
      );
    },
    async HarvestRedispatched(event, db) {
      await db.query(
        `UPDATE harvest_jobs SET worker_id = NULL, lease_until = NULL, redispatches = $2::int, redispatched_at = $3::timestamptz WHERE job_id = $1 AND status = 'running'`,
        [event.data.job_id, event.data.attempt, event.data.at],
      );
    },
    async HarvestRepublished(event, db) {
      await db.query(`UPDATE harvest_jobs SET redispatched_at = $2::timestamptz WHERE job_id = $1 AND status = 'running'`, [event.data.job_id, event.data.at]);
    },
    async HarvestSucceeded(event, db) {
      await db.query(
        `UPDATE harvest_jobs SET status = 'succeeded', finished_at = $2::timestamptz, manifest_sha256 = $3, lease_until = NULL WHERE job_id = $1 AND ${unfinished}`,
        [event.data.job_id, event.data.at, event.data.manifest_sha256],
      );
    },
    async HarvestFailed(event, db) {
      await db.query(
        `UPDATE harvest_jobs SET status = 'failed', finished_at = $2::timestamptz, error_code = $3, error_message = $4, lease_until = NULL WHERE job_id = $1 AND ${unfinished}`,
        [event.data.job_id, event.data.at, toStorableText(event.data.code), toStorableText(event.data.message)],
      );
    },
    async HarvestCancelled(event, db) {
      await db.query(`UPDATE harvest_jobs SET status = 'cancelled', finished_at = $2::timestamptz, lease_until = NULL WHERE job_id = $1 AND ${unfinished}`, [
        event.data.job_id,
        event.data.at,
      ]);
    },
  },
});

export type HarvestJobStatus = 'pending' | 'running' | 'succeeded' | 'failed' | 'cancelled';

/** A job's row, with camelCase fields (`month` as `YYYY-MM`). */
export interface HarvestJobRow {
  jobId: string;
  keyId: string;
  keyPrefix: string;
  userId: string;
  model: string;
  checkpoint: string;
  status: HarvestJobStatus;
  promptCount: number;
  shardCount: number;
  shardSize: number;
  batchSize: number;
  layers: number[];
  estimatedTokens: number;
  shardsDone: number;
  promptsDone: number;
  tokensDone: number;
  bytesDone: number;
  submittedAt: Date;
  startedAt: Date | null;
  finishedAt: Date | null;
  lastProgressAt: Date;
  workerId: string | null;
  leaseUntil: Date | null;
  redispatches: number;
  redispatchedAt: Date | null;
  errorCode: string | null;
  errorMessage: string | null;
  month: string;
  counted: boolean;
  manifestSha256: string | null;
}

/** A pending or running job as the resumer reads it (fits `resumeHarvests`' view). */
export interface ResumableHarvestRow {
  jobId: string;
  keyId: string;
  status: 'pending' | 'running';
  submittedAt: Date;
  startedAt: Date | null;
  leaseUntil: Date | null;
  redispatches: number;
  redispatchedAt: Date | null;
  lastProgressAt: Date;
}

/** A recorded shard's row: the shard record, its job and when it was written. */
export interface HarvestShardRow extends HarvestShard {
  jobId: string;
  writtenAt: Date;
}

const jobColumns = `job_id, key_id, key_prefix, user_id, model, checkpoint, status, prompt_count, shard_count, shard_size, batch_size, layers, estimated_tokens,
  shards_done, prompts_done, tokens_done, bytes_done, submitted_at, started_at, finished_at, last_progress_at, worker_id, lease_until, redispatches,
  redispatched_at, error_code, error_message, to_char(month, 'YYYY-MM') AS month, counted, manifest_sha256`;

const date = (v: unknown): Date => new Date(v as string);
const dateOrNull = (v: unknown): Date | null => (v === null || v === undefined ? null : new Date(v as string));
const textOrNull = (v: unknown): string | null => (v === null || v === undefined ? null : String(v));

function jobRow(r: Record<string, unknown>): HarvestJobRow {
  return {
    jobId: String(r.job_id),
    keyId: String(r.key_id),
    keyPrefix: String(r.key_prefix),
    userId: String(r.user_id),
    model: String(r.model),
    checkpoint: String(r.checkpoint),
    status: r.status as HarvestJobStatus,
    promptCount: Number(r.prompt_count),
    shardCount: Number(r.shard_count),
    shardSize: Number(r.shard_size),
    batchSize: Number(r.batch_size),
    layers: (typeof r.layers === 'string' ? JSON.parse(r.layers) : r.layers) as number[],
    estimatedTokens: Number(r.estimated_tokens),
    shardsDone: Number(r.shards_done),
    promptsDone: Number(r.prompts_done),
    tokensDone: Number(r.tokens_done),
    bytesDone: Number(r.bytes_done),
    submittedAt: date(r.submitted_at),
    startedAt: dateOrNull(r.started_at),
    finishedAt: dateOrNull(r.finished_at),
    lastProgressAt: date(r.last_progress_at),
    workerId: textOrNull(r.worker_id),
    leaseUntil: dateOrNull(r.lease_until),
    redispatches: Number(r.redispatches),
    redispatchedAt: dateOrNull(r.redispatched_at),
    errorCode: textOrNull(r.error_code),
    errorMessage: textOrNull(r.error_message),
    month: String(r.month),
    counted: r.counted === true,
    manifestSha256: textOrNull(r.manifest_sha256),
  };
}

/** One job's row, or null when the projection has none (yet). */
export async function harvestJobRow(db: Queryable, jobId: string): Promise<HarvestJobRow | null> {
  const { rows } = await db.query<Record<string, unknown>>(`SELECT ${jobColumns} FROM harvest_jobs WHERE job_id = $1`, [jobId]);
  return rows.length === 0 ? null : jobRow(rows[0]);
}

/**
 * A user's jobs (every key of the user), newest first, at most `limit`. `before`: only jobs listed
 * after this one (its id, as a page's cursor; an unknown id gives none) or submitted before this time.
 */
export async function listHarvestJobs(db: Queryable, options: { userId: string; limit: number; before?: string | Date }): Promise<HarvestJobRow[]> {
  const { userId, limit, before } = options;
  const params: unknown[] = [userId, Math.max(0, Math.floor(limit))];
  let after = '';
  if (typeof before === 'string') {
    params.push(before);
    after = 'AND (submitted_at, job_id) < (SELECT submitted_at, job_id FROM harvest_jobs WHERE job_id = $3)';
  } else if (before instanceof Date) {
    params.push(before.toISOString());
    after = 'AND submitted_at < $3::timestamptz';
  }
  const { rows } = await db.query<Record<string, unknown>>(
    `SELECT ${jobColumns} FROM harvest_jobs WHERE user_id = $1 ${after} ORDER BY submitted_at DESC, job_id DESC LIMIT $2`,
    params,
  );
  return rows.map(jobRow);
}

/** Every pending or running job, oldest first: what the resumer looks at. */
export async function resumableHarvestJobs(db: Queryable, limit = 10_000): Promise<ResumableHarvestRow[]> {
  const { rows } = await db.query<Record<string, unknown>>(
    `SELECT job_id, key_id, status, submitted_at, started_at, lease_until, redispatches, redispatched_at, last_progress_at
     FROM harvest_jobs WHERE ${unfinished} ORDER BY submitted_at, job_id LIMIT $1`,
    [limit],
  );
  return rows.map((r) => ({
    jobId: String(r.job_id),
    keyId: String(r.key_id),
    status: r.status as 'pending' | 'running',
    submittedAt: date(r.submitted_at),
    startedAt: dateOrNull(r.started_at),
    leaseUntil: dateOrNull(r.lease_until),
    redispatches: Number(r.redispatches),
    redispatchedAt: dateOrNull(r.redispatched_at),
    lastProgressAt: date(r.last_progress_at),
  }));
}

/**
 * Of `jobIds` (the jobs that still have files), those that failed or were cancelled before `endedBefore`
 * (ISO): the retention removes their files.
 */
export async function expiredHarvestJobs(db: Queryable, jobIds: readonly string[], endedBefore: string): Promise<string[]> {
  if (jobIds.length === 0) return [];
  const { rows } = await db.query<{ job_id: string }>(
    `SELECT job_id FROM harvest_jobs WHERE job_id = ANY($1::text[]) AND status IN ('failed', 'cancelled') AND finished_at < $2::timestamptz ORDER BY finished_at, job_id`,
    [jobIds, endedBefore],
  );
  return rows.map((r) => String(r.job_id));
}

/** A job's recorded shards, in order. */
export async function harvestShardRows(db: Queryable, jobId: string): Promise<HarvestShardRow[]> {
  const { rows } = await db.query<Record<string, unknown>>(
    'SELECT job_id, shard, file, first_prompt, prompt_count, token_count, bytes, sha256, written_at FROM harvest_shards WHERE job_id = $1 ORDER BY shard',
    [jobId],
  );
  return rows.map((r) => ({
    jobId: String(r.job_id),
    shard: Number(r.shard),
    file: String(r.file),
    first_prompt: Number(r.first_prompt),
    prompt_count: Number(r.prompt_count),
    token_count: Number(r.token_count),
    bytes: Number(r.bytes),
    sha256: String(r.sha256),
    writtenAt: date(r.written_at),
  }));
}
