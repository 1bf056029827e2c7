// Where each backend's engine runs: `static` (a URL that is always on) or `local-process` (the
// reference engine as a child process, started on demand, stopped when idle). See README.md.
import type { Logger } from 'pino';
import type { ModelConfig } from '../config/index.ts';
import { LocalProcessPlatform, type EngineBootKnobs } from './local-process.ts';
import { StaticPlatform } from './static.ts';
import type { BootStageListener, Platform } from './types.ts';

export * from './types.ts';
export { LocalProcessPlatform, type EngineBootKnobs, type LocalProcessOptions } from './local-process.ts';
export { StaticPlatform } from './static.ts';

export interface PlatformSettings {
  configPath: string | null;
  /** No request for this long stops a local engine (scale to zero); 0 never does. */
  idleMs: number;
  /** A local engine whose process has not started within this long is given up (503 platform_cold_boot). */
  ackTimeoutMs: number;
  chaos?: boolean;
  knobs?: EngineBootKnobs;
  logger: Logger;
  onStage: BootStageListener;
  /** A model's engine now serves at `url` (after each boot of a local engine). */
  onServing(modelId: string, url: string, pid: number): void;
}

/** The platform of one model: `reference` engines run as local processes, a URL is static. */
export function platformFor(model: ModelConfig, settings: PlatformSettings): Platform {
  if (model.engine !== 'reference') return new StaticPlatform(model.id, model.engine.replace(/\/+$/, ''));
  return new LocalProcessPlatform({
    modelId: model.id,
    configPath: settings.configPath,
    chaos: settings.chaos,
    knobs: settings.knobs,
    idleMs: settings.idleMs,
    ackTimeoutMs: settings.ackTimeoutMs,
    logger: settings.logger,
    onStage: settings.onStage,
    onServing: (url, pid) => settings.onServing(model.id, url, pid),
  });
}
