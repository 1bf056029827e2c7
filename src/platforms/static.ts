// `static`: an engine at a fixed URL that is always on (a production vLLM). Nothing to start or stop;
// its warmth is not known here (status falls back to a recent completion).
import type { Boot, Platform, PublishedStage } from './types.ts';

export class StaticPlatform implements Platform {
  readonly kind = 'static';

  constructor(
    readonly modelId: string,
    readonly url: string,
  ) {}

  ensureRunning(): Boot | null {
    return null;
  }

  hold(): () => void {
    return () => {};
  }

  runners(): null {
    return null;
  }

  latestStage(): PublishedStage | null {
    return null;
  }

  async warmUp(): Promise<void> {}

  shuttingDown(): void {}

  async stop(): Promise<void> {}
}
