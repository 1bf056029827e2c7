/** The gateway's harvest part: the dispatch transport, the service, this process's workers, and the harvests' timers. */
import type { Settings } from '../config/index.ts';
import type { CommandHandler } from '../command-handler/index.ts';
import type { ServiceWorkflows } from '../processors/index.ts';
import type { EventStore } from '../store/index.ts';
import type { Logger } from '../api/index.ts';
import { fileHarvestStorage, harvestTimers, HarvestService, HarvestWorker, type HarvestWorkerOptions } from '../harvest/index.ts';
import { inProcessTransport, kafkaTransport, postgresTransport, type DispatchTransport } from '../dispatch/index.ts';
import type { ModelRegistry } from '../registry/index.ts';

/** The harvest jobs' dispatch transport the settings name (src/dispatch). */
function dispatchTransportFor(settings: Settings, store: EventStore, logger: Logger): DispatchTransport {
  const onError = (error: unknown) => logger.warn({ err: (error as Error)?.message }, 'harvest dispatch failed; retrying');
  switch (settings.harvest.transport) {
    case 'postgres':
      return postgresTransport(store, {
        // A message whose worker died is delivered again once its visibility (renewed by the worker's heartbeat) lapses: the claim's lease.
        visibilityTimeoutMs: settings.harvest.leaseMs,
        // Its own LISTEN connection: a job published by another process reaches an idle worker at once, not at the next poll.
        listenUrl: settings.databaseUrl ?? undefined,
        onError,
      });
    case 'kafka':
      // A consumer that dies leaves its group after the session timeout; another takes its partitions and redelivers.
      return kafkaTransport({ brokers: [], ...settings.harvest.kafka, sasl: settings.harvest.kafka?.sasl ?? undefined, onError });
    case 'inprocess':
      return inProcessTransport();
  }
}

/**
 * Harvests: jobs dispatched on a transport to this process's workers (or another's), files under
 * SVC_HARVEST_DIR. Each part started is pushed on `stoppers`; the timers (resumer, retention) are for
 * the workflow processor.
 */
export function startHarvests(
  settings: Settings,
  deps: { store: EventStore; commands: CommandHandler; registry: ModelRegistry; logger: Logger; worker: Omit<HarvestWorkerOptions, 'service' | 'storage' | 'transport' | 'registry' | 'settings' | 'logger'> },
  stoppers: (() => Promise<unknown>)[],
): { harvests: HarvestService; timers: ServiceWorkflows } {
  const { store, commands, registry, logger } = deps;
  const storage = fileHarvestStorage(settings.harvest.storageDir);
  const transport = dispatchTransportFor(settings, store, logger);
  stoppers.push(() => transport.close());
  const harvests = new HarvestService({ handler: commands, db: store, storage, transport, registry, settings: settings.harvest, logger });
  harvests.start();
  stoppers.push(async () => harvests.stop());
  if (settings.harvest.workers > 0) {
    const worker = new HarvestWorker({ ...deps.worker, service: harvests, storage, transport, registry, settings: settings.harvest, logger });
    worker.start();
    stoppers.push(() => worker.stop());
  }
  const timers = harvestTimers({
    service: harvests,
    db: store,
    leaseMs: settings.harvest.leaseMs,
    maxRedispatches: settings.harvest.maxRedispatches,
    retention: { storage, failedRetentionMs: settings.harvest.failedRetentionMs },
  });
  return { harvests, timers };
}
