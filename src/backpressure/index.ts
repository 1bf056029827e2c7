/** Backpressure: waiting for a refused write to drain, shared by the gateway's relays and the reference engine's body writer. */
import type { Writable } from 'node:stream';

/**
 * Waits for a writable that refused a write: true once it drains, false if it closes first. Its two
 * listeners are removed either way (a race of two `events.once` leaves the loser's, and an `error`
 * listener each, on the stream for every refused write: for a gigabyte body, thousands).
 */
export function drained(stream: Writable): Promise<boolean> {
  return new Promise((resolve) => {
    const done = (ok: boolean) => () => {
      stream.off('drain', onDrain);
      stream.off('close', onClose);
      resolve(ok);
    };
    const onDrain = done(true);
    const onClose = done(false);
    stream.on('drain', onDrain);
    stream.on('close', onClose);
  });
}
