import { EventEmitter, once } from 'node:events';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { DestinationStream } from 'pino';
import {
  adminKeyRoutes,
  breakerHealth,
  buildApp,
  completionRoutes,
  metricsRoutes,
  readHarvestProgress,
  Observed,
  LastCompletions,
  createLogger,
  decorateAuthenticatedRequest,
  modelRoutes,
  modelStatusRoutes,
  modelStatusSource,
  harvestRoutes,
  requireApiKey,
  AuthFailureLimiter,
  type BackendHealth,
  type Logger,
  type RequestKey,
} from '../api/index.ts';
import { Metering } from '../metering/index.ts';
import { resolveAdminToken, resolveSqlPasswords, type ModelConfig, type Settings } from '../config/index.ts';
import { CommandHandler } from '../command-handler/index.ts';
import { KeyService } from '../keys/index.ts';
import { BackendService } from '../backends/index.ts';
import { EngineClient } from '../engine-client/index.ts';
import { ModelRegistry } from '../registry/index.ts';
import { TokenizerPool } from '../tokenizer/index.ts';
import { openEventStore, serveReadOnlySql, type EventLog, type EventStore } from '../store/index.ts';
import { openConfiguredEventLog } from './event-log.ts';
import { platformFor, type BootStageListener, type EngineBootKnobs, type Platform } from '../platforms/index.ts';
import { portBlocked } from './preflight.ts';
import { ProjectionRunner } from '../processors/index.ts';
import { WorkflowProcessor } from '../processors/index.ts';
import { workflows } from '../../workflows/index.ts';
import { projections } from '../../projections/index.ts';
import { lastCompletions } from '../../projections/backend-health.ts';
import type { HarvestService } from '../harvest/index.ts';
import { drainAndClose, pingBoth, trackConnections } from './http.ts';
import { startHarvests } from './harvests.ts';

export { EventLogUnreachable, openConfiguredEventLog, redactedEventStoreUrl } from './event-log.ts';

export interface GatewayOptions {
  /** Where log lines go (default: stdout). Tests pass a stream to inspect them. */
  logDestination?: DestinationStream;
  /** Start reference engines with their failure-injection route (tests only). */
  chaosEngines?: boolean;
  /** Slow, failed or stalled boots of the reference engines, read at each boot (tests only; see src/platforms). */
  engineBootKnobs?: EngineBootKnobs;
  /** The operators' token for the admin API (default: SVC_ADMIN_TOKEN, else DATA_DIR/admin-token, created if missing). */
  adminToken?: string;
  /** The store's check against its own calls inside a transaction (default true; `svc serve` turns it off, see OpenEventStoreOptions.nestedCallCheck). */
  storeNestedCallCheck?: boolean;
  /** Serve the embedded store read-only over the PostgreSQL wire protocol on this loopback port (0: any free one); off by default. */
  sqlPort?: number | null;
  /** The SQL port's passwords (default: resolveSqlPasswords, created if missing). */
  sqlPasswords?: { analyst: string; owner: string };
  /** `worker` (`svc worker`): everything but the HTTP API, for a process that only works on harvest jobs. */
  role?: 'serve' | 'worker';
}

export interface Gateway {
  url: string;
  app: FastifyInstance;
  /** The SQL store: projections' rows, checkpoints, leases, dispatch and harvest tables (and the log, with SVC_EVENT_LOG=sql). */
  store: EventStore;
  /** The event log: `store` itself, or EventStoreDB/KurrentDB's with SVC_EVENT_LOG=eventstoredb. */
  log: EventLog;
  /** The read-only SQL port's number, when one is served. */
  sqlPort: number | null;
  registry: ModelRegistry;
  /** Runs deciders against streams; every stream's state is cached (keys now, meters later). */
  commands: CommandHandler;
  /** API keys: authentication, current state for the metering re-check, administration. */
  keys: KeyService;
  /** Each backend's circuit breaker and boot stages (src/backends). */
  backends: BackendService;
  /** Bulk activation harvests: the service behind the routes (src/harvest). */
  harvests: HarvestService;
  /** Resolves once every projection has applied every event committed before the call. */
  projectionsCaughtUp(): Promise<void>;
  logger: Logger;
  /** Base URL of each model's engine. */
  engineUrls: Map<string, string>;
  /** Process id of each reference engine the gateway started. */
  enginePids: Map<string, number>;
  /** Where each model's engine runs (src/platforms): boots, runners, the idle stop. */
  platforms: Map<string, Platform>;
  /** Resolves with the new address when the model's reference engine next comes back after dying. */
  engineRestarted(modelId: string): Promise<string>;
  close(): Promise<void>;
}

/** How long a boot stage or a completion counts as recent (boot freshness, warm estimate). */
const freshForMs = 15 * 60_000;

/**
 * Starts the whole service: event store, model registry (tokenizers), reference engines as child
 * processes, engine pools and the HTTP API. `close` drains in-flight requests, then stops the rest.
 */
export async function startGateway(settings: Settings, options: GatewayOptions = {}): Promise<Gateway> {
  const logger = createLogger(settings.logLevel, options.logDestination);
  const stoppers: (() => Promise<unknown>)[] = [];
  const stopAll = async () => {
    for (const stop of stoppers.reverse()) await stop().catch((err) => logger.error({ err: String(err) }, 'shutdown step failed'));
  };
  try {
    // The store, the tokenizers and the engine processes start side by side; startup is the slowest of them.
    const registry = new ModelRegistry(settings.models);
    stoppers.push(async () => registry.close());
    // Long prompts are tokenized in worker threads, off the event loop (src/tokenizer/pool.ts).
    const tokenizers = new TokenizerPool();
    stoppers.push(() => tokenizers.close());
    const engineUrls = new Map<string, string>();
    const enginePids = new Map<string, number>();
    const restarts = new EventEmitter();
    let engines: EngineClient | null = null;
    // Boot stages go to the log's backend streams once the backend service is up; until then, only the platform keeps them.
    let publishStage: BootStageListener = () => {};
    const platforms = new Map<string, Platform>();
    for (const model of settings.models) {
      const platform = platformFor(model, {
        configPath: settings.configPath,
        idleMs: settings.engines.idleMs,
        ackTimeoutMs: settings.engines.ackTimeoutMs,
        chaos: options.chaosEngines,
        knobs: options.engineBootKnobs,
        logger,
        onStage: (...stage) => publishStage(...stage),
        onServing: (modelId, url, pid) => {
          engineUrls.set(modelId, url);
          enginePids.set(modelId, pid);
          engines?.retarget(modelId, url);
          restarts.emit(modelId, url);
        },
      });
      platforms.set(model.id, platform);
      stoppers.push(() => platform.stop());
      if (platform.url) engineUrls.set(model.id, platform.url);
    }
    // Reference engines start on their first request (a cold boot), or here when warm at start.
    const startEngine = async (model: ModelConfig) => {
      if (settings.engines.warmAtStart) await platforms.get(model.id)!.warmUp();
    };
    // /metrics' histograms fed on the request path: each store append batch's time, the time added to each completion.
    const observed = new Observed();
    const openStore = async () => {
      const opened = await openEventStore({ databaseUrl: settings.databaseUrl, dataDir: settings.dataDir, purpose: 'svc serve', nestedCallCheck: options.storeNestedCallCheck, onAppend: (ms) => observed.appended(ms) });
      stoppers.push(() => opened.close());
      return opened;
    };
    const storeOpening = openStore();
    // With SVC_EVENT_LOG=eventstoredb the log is EventStoreDB's, opened beside the SQL store (which keeps every row).
    const logOpening = openConfiguredEventLog(settings, { onAppend: (ms) => observed.appended(ms) });
    // Every start is awaited before deciding, so nothing spawned is left running when one fails.
    const started = await Promise.allSettled([storeOpening, logOpening, registry.loadTokenizers(), ...settings.models.map(startEngine)]);
    const esdb = started[1].status === 'fulfilled' ? started[1].value : null;
    // Pushed after the store's close, so it runs before it (stoppers run last first) and after the processors that follow the log stop.
    if (esdb) stoppers.push(() => esdb.close());
    // The event log's failure first: it names EVENTSTORE_URL in one line.
    const failed = started[1].status === 'rejected' ? started[1] : started.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) throw failed.reason;
    const store = await storeOpening;
    const log: EventLog = esdb ?? store;
    const sqlPort =
      options.sqlPort == null
        ? null
        : await serveReadOnlySql(store, { port: options.sqlPort, passwords: options.sqlPasswords ?? resolveSqlPasswords(process.env, settings.dataDir, true)! });
    if (sqlPort) stoppers.push(() => sqlPort.close());

    // Read models follow the log from their checkpoints (catch-up, then live), each in the one process holding its lease; stopped before the store.
    const runner = new ProjectionRunner({
      log,
      db: store,
      projections,
      leaseMs: settings.processorLeaseMs,
      onError: (projection, error) => logger.error({ projection, err: (error as Error)?.message }, 'projection batch failed; retrying'),
    });
    if (settings.projections) {
      await runner.start();
      stoppers.push(() => runner.stop());
    }
    const projectionsCaughtUp = () => (settings.projections ? runner.caughtUp() : Promise.resolve());

    const commands = new CommandHandler({ store: log });
    stoppers.push(() => commands.settled());
    // The handler's cache follows the log: another process's write to a stream is read before the next decision there.
    const following = await commands.followLog((error) => logger.error({ err: (error as Error)?.message }, 'log subscription (cache freshness) failed a read; retrying'));
    stoppers.push(() => following.stop());
    const keys = new KeyService({ handler: commands });
    await keys.start();
    stoppers.push(() => keys.stop());
    // Circuit breakers: every backend's state in memory, kept fresh from the log; checked before each engine call.
    const backendService = new BackendService({
      handler: commands,
      settings: settings.breaker,
      upstreamHeaders: (modelId) => engines?.upstreamHeaders(modelId) ?? {},
      onError: (error, what) => logger.error({ err: (error as Error)?.message }, `backend breaker: ${what} failed`),
    });
    // A model's activation engine has a backend of its own where it runs apart (not the reference engine's
    // one process): its stages, logged by whatever boots it, are read from its stream for the status route.
    await backendService.start(settings.models.map((m) => ({ id: m.id, activation: Boolean(m.activations) && platforms.get(m.id)?.kind !== 'local-process' })));
    stoppers.push(() => backendService.stop());
    // Boot stages are events on the backend streams from here on; a stage reached before (a warm start) goes first.
    publishStage = (modelId, backend, stage, reason) =>
      void backendService.publishBootStage(modelId, backend, stage, reason).catch((err) => logger.error({ model: modelId, stage, err: (err as Error)?.message }, 'boot stage not recorded'));
    for (const platform of platforms.values()) {
      const latest = platform.latestStage();
      if (latest) publishStage(platform.modelId, 'completion', latest.stage, latest.reason);
    }
    const adminToken = options.adminToken ?? resolveAdminToken(process.env, settings.dataDir).token;
    // Failed authentications per client address, across the key and admin routes of this process.
    const authFailures = new AuthFailureLimiter(settings.authFailures);
    const authenticate = requireApiKey(keys, authFailures);
    const metering = settings.metering
      ? new Metering({ handler: commands, log, db: store, logger, reservationTtlMs: settings.reservationTtlMs, slotLeaseTtlMs: Math.min(settings.slotLeaseTtlMs, settings.reservationTtlMs), dailySpendCap: settings.dailySpendCap })
      : null;
    if (metering) {
      metering.start();
      stoppers.push(() => metering.stop());
    }
    const keyOf = (request: FastifyRequest): RequestKey | null => {
      const key = request.apiKey;
      if (!key) return null;
      return {
        keyId: key.keyId,
        prefix: key.prefix,
        email: key.email,
        current: async () => {
          const now = await keys.current(key.prefix);
          return now ? { keyId: now.keyId, status: now.status, budgets: now.budgets } : { keyId: key.keyId, status: 'revoked', budgets: key.budgets };
        },
      };
    };

    // A cold engine has no address yet: every request to it waits out its boot, which points the pool at it.
    const notStarted = 'http://127.0.0.1:9';
    engines = new EngineClient(
      settings.models.map((m) => ({ modelId: m.id, url: engineUrls.get(m.id) ?? notStarted, checkpoint: m.checkpoint, gpuShape: m.gpu_shape })),
    );
    stoppers.push(() => engines.close());

    const { harvests, timers: harvestTimers } = startHarvests(
      settings,
      {
        store,
        commands,
        registry,
        logger,
        worker: {
          engines,
          context: { registry, tokenizers, requestWindowMs: settings.requestWindowMs, deadlineTokensPerSecond: settings.deadlineTokensPerSecond },
          platformOf: (modelId) => platforms.get(modelId),
          backends: backendService,
          metering: metering ? { meter: metering, key: (prefix) => keys.current(prefix) } : null,
        },
      },
      stoppers,
    );

    // Reactions across streams (a hold carried over midnight released on the day that carried it) and
    // the timers (the breakers' half-open, the reaper, the spend watcher, the harvests' resumer and
    // retention) follow the log, each in the one process holding its lease; stopped before the services.
    const timed = [backendService.timers(), ...(metering ? [metering.timers()] : []), harvestTimers];
    const workflowProcessor = new WorkflowProcessor({
      log,
      db: store,
      handler: commands,
      workflows: [...workflows, ...timed.flatMap((t) => t.workflows)],
      deliver: Object.assign({}, ...timed.map((t) => t.deliver)),
      leaseMs: settings.processorLeaseMs,
      onError: (workflow, error) => logger.error({ workflow, err: (error as Error)?.message }, 'workflow batch failed; retrying'),
    });
    await workflowProcessor.start();
    stoppers.push(() => workflowProcessor.stop());

    // Each model's last completion across processes: the backend_health projection's, read every second, or this process's own if later.
    const lastCompletion = new LastCompletions(settings.projections ? () => lastCompletions(store) : null);
    await lastCompletion.start();
    stoppers.push(() => lastCompletion.stop());
    // A boot stage or a completion counts as recent within the idle window (the default's 15 minutes when engines never idle out).
    const freshMs = settings.engines.idleMs || freshForMs;
    // One warmth rule for /health and the status route: the platform's runner count when it knows one,
    // else a completion served within the freshness window.
    const warm = (id: string): boolean => {
      const runners = platforms.get(id)?.runners() ?? null;
      if (runners !== null) return runners > 0;
      const last = lastCompletion.latest(id);
      return last !== undefined && Date.now() - last < freshMs;
    };
    const backends = (): BackendHealth[] =>
      settings.models.map((m) => {
        const last = lastCompletion.latest(m.id) ?? null;
        return {
          model_id: m.id,
          status: m.status ?? 'live',
          gpu_shape: m.gpu_shape,
          ...breakerHealth(backendService.snapshot(m.id)),
          last_completion_at: last === null ? null : new Date(last).toISOString(),
          last_completion_seconds_ago: last === null ? null : Math.floor((Date.now() - last) / 1000),
          warm_estimate: warm(m.id) ? 'warm' : 'cold',
        };
      });

    const app = await buildApp({
      logger,
      timeouts: settings.http,
      trustedProxies: settings.trustedProxies,
      parseLargeJson: (bytes) => tokenizers.parseJson(bytes),
      // The database's round trip, and EventStoreDB's beside it: /health's `database` is down when either is.
      health: { pingStore: (timeoutMs) => pingBoth(store, esdb, timeoutMs), backends },
      routes: async (scope) => {
        decorateAuthenticatedRequest(scope);
        completionRoutes(scope, {
          authenticate,
          context: { registry, tokenizers, requestWindowMs: settings.requestWindowMs, deadlineTokensPerSecond: settings.deadlineTokensPerSecond },
          engines,
          requestWindowMs: settings.requestWindowMs,
          onServed: (modelId, addedMs) => {
            lastCompletion.served(modelId);
            observed.served(modelId, addedMs);
          },
          // A request to a cold model (scaled to zero, or a crashed engine being started again) waits out its boot.
          coldBoots: {
            platformOf: (modelId) => platforms.get(modelId),
            options: { graceMs: settings.engines.graceMs, keepaliveMs: settings.engines.keepaliveMs, deadlineMs: settings.engines.bootDeadlineMs },
          },
          metering: metering ? { meter: metering, keyOf } : undefined,
          backends: backendService,
        });
        modelRoutes(scope, registry, authenticate);
        modelStatusRoutes(scope, registry, modelStatusSource({ platforms, warm, freshMs, loggedStage: (id, backend) => backendService.snapshot(id, backend)?.boot ?? null }), authenticate);
        adminKeyRoutes(scope, { keys, adminToken, authFailures, db: store, projectionsCaughtUp });
        harvestRoutes(scope, { service: harvests, authenticate });
        // Prometheus metrics for operators, behind the admin token.
        metricsRoutes(scope, { adminToken, authFailures, backends: () => backendService.snapshots(), projectionLag: () => runner.status(), requests: metering ? () => metering.counts() : undefined, observed, harvests: () => readHarvestProgress(store) });
      },
    });
    const connections = trackConnections(app.server);
    stoppers.push(() => drainAndClose(app, settings.shutdownGraceMs, connections));
    // A worker process (`svc worker`) serves no HTTP: the app is built but never listens.
    let address = '';
    if (options.role !== 'worker') {
      // The port was checked before anything started (preflight.ts); another process can still take it meanwhile.
      address = await app.listen({ port: settings.port, host: settings.host }).catch((err: NodeJS.ErrnoException) => {
        throw portBlocked(err, settings.port, settings.host, 'PORT') ?? err;
      });
      logger.info({ url: address }, 'gateway listening');
    }

    let closing: Promise<void> | null = null;
    return {
      url: address.replace('[::1]', '127.0.0.1'),
      app,
      store,
      log,
      sqlPort: sqlPort?.port ?? null,
      registry,
      commands,
      keys,
      backends: backendService,
      harvests,
      projectionsCaughtUp,
      logger,
      engineUrls,
      enginePids,
      platforms,
      engineRestarted: async (modelId) => String((await once(restarts, modelId))[0]),
      // Engines are not started again from here on: one that dies now (a terminal's Ctrl-C reaches the
      // whole process group) is part of the shutdown, not a crash.
      close: () => (closing ??= (platforms.forEach((platform) => platform.shuttingDown()), stopAll()).then(() => new Promise<void>((resolve) => logger.flush(() => resolve())))),
    };
  } catch (err) {
    await stopAll();
    throw err;
  }
}
