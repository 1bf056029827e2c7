/**
 * `GET /metrics`: the Prometheus text format (prom-client, as vLLM and LiteLLM expose theirs), for
 * operators; behind the admin token. Request counts and durations are kept by one onResponse hook
 * (a label lookup and an increment per request); everything else (breakers, boot stages, projection
 * lag, active and queued requests in all and per key, harvest jobs' progress) is read when Prometheus
 * scrapes, from memory, one small query per projection and two on the harvest_jobs table. Two histograms are fed where their times are known, before the routes exist
 * (`Observed`): each store append batch's time (the store's onAppend) and the time the gateway added
 * to each served completion (the completion route's onServed).
 */
import type { FastifyInstance } from 'fastify';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { requireAdminToken } from './auth.ts';
import type { AuthFailureLimiter } from './auth-failures.ts';
import { adminSecurity, adminTag, errorResponses } from './route-schema.ts';
import type { BackendSnapshot } from '../backends/index.ts';

export interface MetricsSources {
  /** The operators' token (the admin API's). */
  adminToken: string;
  /** Failed authentications per address (shared with the other authenticated routes). */
  authFailures?: AuthFailureLimiter;
  /** Every backend's breaker and boot stage, from memory (src/backends). */
  backends(): BackendSnapshot[];
  /** Each projection's lag behind the log, in events (the projection runner's status). */
  projectionLag?(): Promise<{ name: string; lag: number }[]>;
  /** This process's metered requests holding a reservation, and waiting in a key's queue, in all and per key (absent when metering is off). */
  requests?(): { running: number; queued: number; byKey?: { keyId: string; running: number; queued: number }[] };
  /** Harvest jobs by status and each unfinished job's progress (the harvest_jobs projection; readHarvestProgress). */
  harvests?(): Promise<HarvestProgress>;
  /** The histograms fed from the store and the completion route. */
  observed?: Observed;
}

export interface HarvestProgress {
  jobs: { status: string; count: number }[];
  /** Pending and running jobs. */
  unfinished: { jobId: string; model: string; status: string; prompts: number; promptsDone: number }[];
}

const harvestStatuses = ['pending', 'running', 'succeeded', 'failed', 'cancelled'] as const;
/** Per-job series are kept for this many unfinished jobs at most (the oldest first). */
const maxJobSeries = 500;

/** Reads HarvestProgress from the harvest_jobs projection's table; empty before the projection made it. */
export async function readHarvestProgress(db: { query<T>(sql: string, params?: unknown[]): Promise<{ rows: T[] }> }): Promise<HarvestProgress> {
  const { rows: exists } = await db.query<{ t: string | null }>(`SELECT to_regclass('harvest_jobs')::text AS t`);
  if (!exists[0]?.t) return { jobs: [], unfinished: [] };
  const { rows: jobs } = await db.query<{ status: string; count: string }>('SELECT status, count(*) AS count FROM harvest_jobs GROUP BY status');
  const { rows: unfinished } = await db.query<{ job_id: string; model: string; status: string; prompt_count: number; prompts_done: number }>(
    `SELECT job_id, model, status, prompt_count, prompts_done FROM harvest_jobs WHERE status IN ('pending', 'running') ORDER BY submitted_at, job_id LIMIT ${maxJobSeries}`,
  );
  return {
    jobs: jobs.map((r) => ({ status: r.status, count: Number(r.count) })),
    unfinished: unfinished.map((r) => ({ jobId: r.job_id, model: r.model, status: r.status, prompts: Number(r.prompt_count), promptsDone: Number(r.prompts_done) })),
  };
}

const latencyBuckets = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];

/** Histograms observed on the request path (a bucket increment each), made before the store opens. */
export class Observed {
  readonly storeAppend = new Histogram({
    name: 'svc_store_append_seconds',
    help: 'Time to store one group commit (one transaction carrying the appends of concurrent decisions), failed ones included.',
    buckets: latencyBuckets,
    registers: [],
  });
  readonly addedLatency = new Histogram({
    name: 'svc_added_latency_seconds',
    help: 'Time the gateway added to a served completion, by model: its time before the engine call (a cold boot\'s wait excluded) plus from the engine\'s response headers to the response being handed on.',
    labelNames: ['model'] as const,
    buckets: latencyBuckets,
    registers: [],
  });

  appended(ms: number): void {
    this.storeAppend.observe(ms / 1000);
  }

  served(modelId: string, addedMs: number): void {
    this.addedLatency.observe({ model: modelId }, Math.max(0, addedMs) / 1000);
  }
}

const breakerStates = ['closed', 'open', 'half_open'] as const;
const bootStages = ['waiting_for_gpu', 'container_started', 'weights_loading', 'weights_loaded', 'engine_ready', 'serving', 'failed'] as const;

export function metricsRoutes(app: FastifyInstance, sources: MetricsSources): Registry {
  const registry = new Registry();
  const requests = new Counter({ name: 'svc_http_requests_total', help: 'HTTP requests answered, by route, model and status.', labelNames: ['route', 'model', 'status'] as const, registers: [registry] });
  const duration = new Histogram({
    name: 'svc_http_request_duration_seconds',
    help: 'Time from the request\'s arrival to its response\'s end, by route (an engine call\'s time included).',
    labelNames: ['route'] as const,
    buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900],
    registers: [registry],
  });
  new Gauge({
    name: 'svc_backend_breaker_state',
    help: 'Circuit breaker state per backend: 1 for the current state, 0 for the others.',
    labelNames: ['model', 'backend', 'state'] as const,
    registers: [registry],
    collect() {
      this.reset();
      for (const b of sources.backends()) for (const state of breakerStates) this.set({ model: b.modelId, backend: b.backend, state }, b.breaker === state ? 1 : 0);
    },
  });
  new Gauge({
    name: 'svc_backend_consecutive_failures',
    help: 'Failures in a row per backend (the breaker opens at the configured threshold).',
    labelNames: ['model', 'backend'] as const,
    registers: [registry],
    collect() {
      this.reset();
      for (const b of sources.backends()) this.set({ model: b.modelId, backend: b.backend }, b.consecutiveFailures);
    },
  });
  new Gauge({
    name: 'svc_backend_boot_stage',
    help: 'Latest published boot stage per backend: 1 for the current stage, 0 for the others (no series before any stage).',
    labelNames: ['model', 'backend', 'stage'] as const,
    registers: [registry],
    collect() {
      this.reset();
      for (const b of sources.backends()) {
        if (b.boot) for (const stage of bootStages) this.set({ model: b.modelId, backend: b.backend, stage }, b.boot.stage === stage ? 1 : 0);
      }
    },
  });
  new Gauge({
    name: 'svc_backend_boot_stage_timestamp_seconds',
    help: 'When the latest boot stage was published (Unix seconds), per backend.',
    labelNames: ['model', 'backend'] as const,
    registers: [registry],
    collect() {
      this.reset();
      for (const b of sources.backends()) if (b.boot) this.set({ model: b.modelId, backend: b.backend }, Date.parse(b.boot.at) / 1000);
    },
  });
  if (sources.requests) {
    const counts = sources.requests;
    new Gauge({
      name: 'svc_requests_active',
      help: 'Metered requests of this process holding a reservation (calling the engine, relaying, or settling).',
      registers: [registry],
      collect() {
        this.set(counts().running);
      },
    });
    new Gauge({
      name: 'svc_requests_queued',
      help: 'Metered requests of this process waiting for one of their key\'s active slots.',
      registers: [registry],
      collect() {
        this.set(counts().queued);
      },
    });
  }
  if (sources.requests) {
    const counts = sources.requests;
    // Only keys with a request running or waiting here have a series: the set of keys stays the active ones.
    new Gauge({
      name: 'svc_key_requests_active',
      help: 'Metered requests of this process holding a reservation, per key (its 12-hex key id); keys with none have no series.',
      labelNames: ['key_id'] as const,
      registers: [registry],
      collect() {
        this.reset();
        for (const k of counts().byKey ?? []) if (k.running > 0) this.set({ key_id: k.keyId }, k.running);
      },
    });
    new Gauge({
      name: 'svc_key_requests_queued',
      help: 'Metered requests of this process waiting for one of their key\'s active slots, per key; keys with none have no series.',
      labelNames: ['key_id'] as const,
      registers: [registry],
      collect() {
        this.reset();
        for (const k of counts().byKey ?? []) if (k.queued > 0) this.set({ key_id: k.keyId }, k.queued);
      },
    });
  }
  if (sources.harvests) {
    const progressOf = sources.harvests;
    // One read serves the three gauges of a scrape: prom-client collects them one after another.
    let reading: Promise<HarvestProgress> | null = null;
    const read = () => (reading ??= progressOf().finally(() => setImmediate(() => (reading = null))));
    new Gauge({
      name: 'svc_harvest_jobs',
      help: 'Harvest jobs by status (the harvest_jobs projection: every process sharing the store reports the same).',
      labelNames: ['status'] as const,
      registers: [registry],
      async collect() {
        const { jobs } = await read();
        this.reset();
        for (const status of harvestStatuses) this.set({ status }, jobs.find((j) => j.status === status)?.count ?? 0);
      },
    });
    new Gauge({
      name: 'svc_harvest_job_prompts',
      help: 'Prompts of each pending or running harvest job.',
      labelNames: ['job_id', 'model', 'status'] as const,
      registers: [registry],
      async collect() {
        const { unfinished } = await read();
        this.reset();
        for (const j of unfinished) this.set({ job_id: j.jobId, model: j.model, status: j.status }, j.prompts);
      },
    });
    new Gauge({
      name: 'svc_harvest_job_prompts_done',
      help: 'Prompts harvested so far of each pending or running harvest job.',
      labelNames: ['job_id', 'model', 'status'] as const,
      registers: [registry],
      async collect() {
        const { unfinished } = await read();
        this.reset();
        for (const j of unfinished) this.set({ job_id: j.jobId, model: j.model, status: j.status }, j.promptsDone);
      },
    });
  }
  if (sources.observed) {
    registry.registerMetric(sources.observed.storeAppend);
    registry.registerMetric(sources.observed.addedLatency);
  }
  if (sources.projectionLag) {
    const lagOf = sources.projectionLag;
    new Gauge({
      name: 'svc_projection_lag_events',
      help: 'Events in the log that a projection has not applied yet.',
      labelNames: ['projection'] as const,
      registers: [registry],
      async collect() {
        this.reset();
        for (const { name, lag } of await lagOf()) this.set({ projection: name }, lag);
      },
    });
  }

  app.addHook('onResponse', (request, reply, done) => {
    const route = request.routeOptions.url ?? 'unmatched';
    requests.inc({ route, model: request.served?.model ?? '', status: reply.statusCode });
    duration.observe({ route }, reply.elapsedTime / 1000);
    done();
  });

  const schema = {
    summary: 'Operational metrics in the Prometheus text format (admin token)',
    tags: [adminTag],
    security: adminSecurity,
    hide: true,
    response: errorResponses(401),
  };
  app.get('/metrics', { schema, onRequest: requireAdminToken(sources.adminToken, sources.authFailures) }, async (_request, reply) => {
    const text = await registry.metrics();
    return reply.header('content-type', registry.contentType).send(text);
  });
  return registry;
}
