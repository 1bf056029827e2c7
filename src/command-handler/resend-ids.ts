/**
 * The command ids each cached stream remembers, so that a command sent again (a lost acknowledgement,
 * a client retry) returns its original result and appends nothing twice.
 */
import type { DomainEvent } from '../event-sourcing/index.ts';
import type { Entry, Slot, Stored } from './slot.ts';

export interface ResendIdsOptions {
  /** Command ids remembered across every cached stream, the oldest forgotten first (default 100,000). */
  recentCommands?: number;
  /** The last command ids each stream keeps however busy the others are (default 100). */
  recentCommandsPerStream?: number;
}

export class ResendIds {
  readonly #recentCommands: number;
  readonly #recentPerStream: number;
  /**
   * The streams of the last `#recentCommands` commands remembered, a ring: the next command
   * remembered in a place makes the stream there forget its oldest, unless that leaves it fewer than
   * `#recentPerStream`. So a stream remembers at most that many more than its places in the ring, and
   * the process at most `#recentCommands` plus that many per cached stream: 10,000 per stream let a
   * day's busy meter streams keep millions of decided events in memory (BENCHMARKS.md, gateway).
   */
  readonly #rememberedIn: Slot[] = [];
  #remembered = 0;

  constructor(options: ResendIdsOptions = {}) {
    this.#recentCommands = Math.max(1, options.recentCommands ?? 100_000);
    this.#recentPerStream = options.recentCommandsPerStream ?? 100;
  }

  /** Remembers a command (under way or stored) in its stream's slot; see `#rememberedIn` for what it forgets. */
  remember(slot: Slot, commandId: string, value: Stored | Entry): void {
    slot.recent.delete(commandId);
    const at = this.#remembered++ % this.#recentCommands;
    if (at < this.#rememberedIn.length) {
      const forgetting = this.#rememberedIn[at];
      if (forgetting.recent.size > this.#recentPerStream) forgetting.recent.delete(forgetting.recent.keys().next().value as string);
    }
    this.#rememberedIn[at] = slot;
    slot.recent.set(commandId, value); // last in the map's order
  }

  /** Folds a stored event into what the slot remembers of its command (one command's events may span pages). */
  rememberStored(slot: Slot, commandId: string, event: DomainEvent, streamVersion: number): void {
    const known = slot.recent.get(commandId);
    if (known && !('commandId' in known) && known.version < streamVersion) {
      known.events.push(event);
      known.version = streamVersion;
    } else this.remember(slot, commandId, { version: streamVersion, events: [event] });
  }
}
