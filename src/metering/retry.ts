/**
 * Runs a write that must survive a passing store failure: tried again (with the same command ids, so
 * it is stored at most once) after 0.25, 0.5, 1, ... s, until it is stored, `giveUpAfterMs` has
 * passed, or `signal` aborts (the process stops). True once stored.
 */
import { setTimeout as sleep } from 'node:timers/promises';

export async function persist(write: () => Promise<unknown>, options: { giveUpAfterMs: number; signal: AbortSignal; onRetry(error: unknown): void }): Promise<boolean> {
  const giveUpAt = Date.now() + options.giveUpAfterMs;
  for (let pause = 250; ; pause *= 2) {
    try {
      await write();
      return true;
    } catch (error) {
      if (options.signal.aborted || Date.now() + pause > giveUpAt) return false;
      options.onRetry(error);
      const stopped = await sleep(pause, false, { signal: options.signal }).catch(() => true);
      if (stopped) return false;
    }
  }
}
