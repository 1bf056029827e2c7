// Bulk activation harvests: the application service (submit, read, wait, cancel, download), the
// worker that captures and writes shards, the timers (the resumer that dispatches jobs whose worker is gone, the files' retention), and
// the data plane's storage (README.md here).
export { HarvestService, isTerminal, resolveLayers, harvestJobIdPattern, type HarvestServiceOptions } from './service.ts';
export { HarvestWorker, type HarvestWorkerOptions } from './worker.ts';
export { harvestTimers, type HarvestTimersOptions } from './resumer.ts';
export { fileHarvestStorage, type HarvestStorage } from './storage.ts';
export { harvestWorkKind, type HarvestCaller, type HarvestJobView, type HarvestRequest, type HarvestShardView, type HarvestStatus } from './types.ts';
