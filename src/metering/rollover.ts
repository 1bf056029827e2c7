/**
 * The day rollover: a key's first reservation of a UTC day opens that day's meter with the
 * month-to-date balance of its latest earlier meter day (of the last 31), closing that day first so
 * that no reservation can land there unseen once its balance is read (deciders/meter.ts balanceFrom).
 *
 * It runs on the request path, before the day's first reservation, not in a processor: a reservation
 * cannot wait for one. Its steps are idempotent commands in order (close D, then open D + 1 from D's
 * closed state): a process that dies between them leaves D closed, and the next reservation opens
 * D + 1 from it. A hold of D that ends after the close is the carried-holds workflow's to release.
 */
import type { CommandHandler } from '../command-handler/index.ts';
import type { EventLog } from '../store/index.ts';
import { balanceFrom, meterDecider } from '../../deciders/index.ts';
import { dayAfter, meterStream, type MeterOpening } from '../../events/index.ts';

const opened = Promise.resolve();

export class DayRollover {
  readonly #handler: CommandHandler;
  /** Which of a key's meter days exist: the log's stream versions. */
  readonly #log: Pick<EventLog, 'streamVersions'>;
  /** Openings under way, by stream: concurrent first reservations of a day wait for one opening. */
  readonly #opening = new Map<string, Promise<void>>();
  /**
   * Meters of `#openDay` known open: a meter, once opened, stays so (MeterOpened is never undone), so
   * a key's every later request that day skips the load. Emptied when the day changes.
   */
  readonly #open = new Set<string>();
  #openDay = '';

  constructor(handler: CommandHandler, log: Pick<EventLog, 'streamVersions'>) {
    this.#handler = handler;
    this.#log = log;
  }

  /** Resolves once the key's meter for `day` is open. */
  ensureOpened(keyId: string, day: string, now: Date): Promise<void> {
    if (day !== this.#openDay) {
      this.#openDay = day;
      this.#open.clear();
    }
    const stream = meterStream(keyId, day);
    if (this.#open.has(stream)) return opened;
    let opening = this.#opening.get(stream);
    if (!opening) {
      opening = (async () => {
        const { state } = await this.#handler.load(stream, meterDecider);
        if (!state.opened) {
          const balance = await this.#openingBalance(keyId, day, now);
          await this.#handler.handle(stream, { type: 'OpenMeter', opening: balance, now: now.toISOString() }, meterDecider);
        }
        if (day === this.#openDay) this.#open.add(stream);
      })().finally(() => this.#opening.delete(stream));
      this.#opening.set(stream, opening);
    }
    return opening;
  }

  /**
   * The opening balance: from the key's latest meter day of the last 31, closed first. Which of the 31
   * days have a meter is one read; only those are loaded, latest first.
   */
  async #openingBalance(keyId: string, day: string, now: Date): Promise<MeterOpening> {
    const earlierDays = Array.from({ length: 31 }, (_, i) => dayAfter(day, -(i + 1)));
    const versions = await this.#log.streamVersions(earlierDays.map((d) => meterStream(keyId, d)));
    for (const earlier of earlierDays) {
      const stream = meterStream(keyId, earlier);
      if (!versions.get(stream)) continue;
      const { state } = await this.#handler.load(stream, meterDecider, { fresh: true });
      if (!state.opened) continue;
      const closed = await this.#handler.handle(stream, { type: 'CloseMeter', nextDay: day, now: now.toISOString() }, meterDecider);
      return balanceFrom(keyId, day, earlier, closed.state, now.getTime());
    }
    return { key_id: keyId, day, month_input_tokens: 0, month_output_tokens: 0, carried_from: null, carried_holds: [], carried_leases: [], recent_starts: [] };
  }
}
