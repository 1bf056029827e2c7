import type { FastifyInstance } from 'fastify';
import { Type, type Static } from 'typebox';
import { okResponse } from './route-schema.ts';
import type { BackendSnapshot } from '../backends/index.ts';

export const BackendHealth = Type.Object({
  model_id: Type.String(),
  status: Type.Union([Type.Literal('live'), Type.Literal('staging')]),
  gpu_shape: Type.String(),
  breaker_state: Type.Union([Type.Literal('closed'), Type.Literal('open'), Type.Literal('half_open')]),
  breaker_consecutive_failures: Type.Integer(),
  breaker_last_failure_kind: Type.Union([Type.String(), Type.Null()]),
  last_completion_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
  last_completion_seconds_ago: Type.Union([Type.Integer(), Type.Null()]),
  warm_estimate: Type.Union([Type.Literal('warm'), Type.Literal('cold')]),
});
export type BackendHealth = Static<typeof BackendHealth>;

export const HealthBody = Type.Object({
  status: Type.Union([Type.Literal('ok'), Type.Literal('degraded'), Type.Literal('down')]),
  wrapper: Type.Object({
    uptime_seconds: Type.Integer(),
    database: Type.Object({ ok: Type.Boolean(), latency_ms: Type.Integer() }),
  }),
  backends: Type.Array(BackendHealth),
  degraded_backends: Type.Array(Type.String()),
});
export type HealthBody = Static<typeof HealthBody>;

export interface HealthSources {
  /** The store's round trip; `ok` false when unreachable or slower than the timeout. */
  pingStore(timeoutMs: number): Promise<{ ok: boolean; latencyMs: number }>;
  backends(): BackendHealth[];
}

/** A backend's breaker fields of the health body, from the breaker as this process holds it (src/backends; memory only). */
export function breakerHealth(breaker: BackendSnapshot | null): Pick<BackendHealth, 'breaker_state' | 'breaker_consecutive_failures' | 'breaker_last_failure_kind'> {
  return {
    breaker_state: breaker?.breaker ?? 'closed',
    breaker_consecutive_failures: breaker?.consecutiveFailures ?? 0,
    breaker_last_failure_kind: breaker?.lastFailureKind ?? null,
  };
}

/**
 * Each model's last served completion across every gateway process, as the backend_health projection
 * has it, read again every `everyMs` (1 s): /health answers from memory, and the projection is kept
 * current by the runner from the settlements on the meter streams. `latest(id)` is the later of that
 * and this process's own last completion (`servedHere`), which is known before its settlement is
 * projected (and is all there is with metering off, when nothing is settled).
 */
export class LastCompletions {
  readonly #shared = new Map<string, number>();
  readonly #servedHere = new Map<string, number>();
  #timer: NodeJS.Timeout | null = null;
  #reading: Promise<void> | null = null;

  constructor(private readonly read: (() => Promise<Map<string, number>>) | null, private readonly everyMs = 1000) {}

  /** This process served a completion of the model now. */
  served(modelId: string, at = Date.now()): void {
    this.#servedHere.set(modelId, at);
  }

  /** The latest completion of the model known here (epoch ms), or undefined. */
  latest(modelId: string): number | undefined {
    const shared = this.#shared.get(modelId);
    const here = this.#servedHere.get(modelId);
    return shared === undefined ? here : here === undefined ? shared : Math.max(shared, here);
  }

  /** Reads the projection now and then every `everyMs` (nothing when there is no projection to read). */
  async start(): Promise<void> {
    if (!this.read) return;
    await this.refresh();
    const tick = () => {
      this.#timer = setTimeout(() => void this.refresh().finally(() => this.#timer && tick()), this.everyMs).unref();
    };
    tick();
  }

  async stop(): Promise<void> {
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
    await this.#reading;
  }

  /** One read of the projection; a failed one (the store is down) keeps what was read before. */
  refresh(): Promise<void> {
    if (!this.read) return Promise.resolve();
    this.#reading ??= this.read()
      .then((rows) => {
        for (const [id, at] of rows) this.#shared.set(id, at);
      }, () => {})
      .finally(() => {
        this.#reading = null;
      });
    return this.#reading;
  }
}

const storePingTimeoutMs = 1000;
const startedAt = Date.now();

export async function healthBody(sources: HealthSources): Promise<HealthBody> {
  const pingStarted = performance.now();
  const ping = await sources.pingStore(storePingTimeoutMs).catch(() => ({ ok: false, latencyMs: performance.now() - pingStarted }));
  // An unreachable store reports how long we waited before giving up.
  const database = { ok: ping.ok, latency_ms: Math.round(ping.latencyMs) };
  const backends = sources.backends();
  const degraded = backends.filter((b) => b.breaker_state === 'open').map((b) => b.model_id);
  return {
    status: !database.ok ? 'down' : degraded.length > 0 ? 'degraded' : 'ok',
    wrapper: { uptime_seconds: Math.floor((Date.now() - startedAt) / 1000), database },
    backends,
    degraded_backends: degraded,
  };
}

export function healthRoute(app: FastifyInstance, sources: HealthSources): void {
  const schema = {
    summary: 'Aggregated health',
    response: {
      200: okResponse('Health body (also when degraded)', HealthBody),
      503: okResponse('The service cannot serve (its database is down)', HealthBody),
    },
  };
  app.get('/health', { schema }, async (_request, reply) => {
    const body = await healthBody(sources);
    return reply.code(body.wrapper.database.ok ? 200 : 503).send(body);
  });
}
