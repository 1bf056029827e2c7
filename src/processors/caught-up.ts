/**
 * "Caught up" when another process may be the one applying: a processor this runner applies is
 * awaited on its own reader; any other on its checkpoint, until it passes the log's head as read at
 * the call (after everything committed before the call became readable), whoever moves it.
 */
import type { EventLog, GlobalPosition, Subscription } from '../store/index.ts';
import type { Checkpoint } from './checkpoints.ts';

/** How often a checkpoint moved by another process is read again while waiting. */
const checkpointPollMs = 25;

/** The log's head once every event committed before the call can be read: a checkpoint there has seen them all. */
export async function logTarget(log: EventLog): Promise<GlobalPosition> {
  await log.readable();
  return log.head();
}

export async function caughtUpWith(options: {
  names: readonly string[];
  log: EventLog;
  target(): Promise<GlobalPosition>;
  /** This runner's live reader of the processor, if it applies it now. */
  reader(name: string): Subscription | null;
  stored(names: readonly string[]): Promise<Map<string, Checkpoint>>;
  /** Resolves once a restart of the readers under way (if any) is over. */
  settled(): Promise<void> | null;
  running(): boolean;
}): Promise<void> {
  const { log } = options;
  const pending = new Set(options.names);
  const waiting = new Map<string, Subscription>();
  let target: GlobalPosition | null = null;
  let wake = () => {};
  for (;;) {
    await options.settled();
    if (!options.running()) throw new Error('stopped while waiting to catch up');
    const elsewhere: string[] = [];
    for (const name of pending) {
      const reader = options.reader(name);
      if (!reader) {
        elsewhere.push(name);
        continue;
      }
      if (waiting.get(name) === reader) continue;
      waiting.set(name, reader);
      // Its reader waits for everything committed before now; a reader stopped meanwhile (a lease lost) is looked up again.
      reader.caughtUp().then(
        () => (pending.delete(name), wake()),
        () => (waiting.get(name) === reader && waiting.delete(name), wake()),
      );
    }
    if (elsewhere.length > 0) {
      target ??= await options.target();
      const stored = await options.stored(elsewhere);
      for (const name of elsewhere) {
        const checkpoint = stored.get(name);
        if (checkpoint && log.comparePositions(checkpoint.position, target) >= 0) pending.delete(name);
      }
    }
    if (pending.size === 0) return;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, checkpointPollMs);
      wake = () => (clearTimeout(timer), resolve());
    });
  }
}
