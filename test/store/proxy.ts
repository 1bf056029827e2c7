/** A TCP proxy in front of PostgreSQL that a test controls: forward, go silent, cut after a commit, or hold answers back. */
import net from 'node:net';

export interface TcpProxy {
  /** The database URL with the proxy's address in place of the server's. */
  readonly url: string;
  /** Every connection, open or future, stops forwarding in both directions and never resumes (a black hole). */
  blackHole(): void;
  /** New connections forward again (black-holed ones stay silent). */
  heal(): void;
  /**
   * The next connection that sends a message containing `marker` has its answer dropped and is cut
   * once the server says it is ready for the next query, i.e. after the statement committed.
   * Resolves when the cut happened.
   */
  cutAfterReplyTo(marker: string): Promise<void>;
  /**
   * From now on, the server's answer to every message containing `marker` (a statement's text or its
   * prepared name) reaches the client `ms` later, and whatever the server sends on that connection
   * after it waits behind it: the statement runs and commits at once, its acknowledgement comes late.
   * `ms` 0 stops it.
   */
  delayRepliesTo(marker: string, ms: number): void;
  close(): Promise<void>;
}

/** ReadyForQuery: 'Z', length 5, then the transaction status byte. */
const readyForQuery = Buffer.from([0x5a, 0, 0, 0, 5]);

export async function startProxy(databaseUrl: string): Promise<TcpProxy> {
  const target = new URL(databaseUrl);
  const pairs = new Set<{ client: net.Socket; server: net.Socket; silent: boolean; cutting: boolean; delaying: boolean; held: Promise<void>; waiting: number }>();
  let silent = false;
  let cut: { marker: Buffer; done(): void } | null = null;
  let delay: { marker: Buffer; ms: number } | null = null;
  const proxy = net.createServer((client) => {
    const server = net.connect(Number(target.port || 5432), target.hostname);
    const pair = { client, server, silent, cutting: false, delaying: false, held: Promise.resolve(), waiting: 0 };
    pairs.add(pair);
    const end = () => {
      client.destroy();
      server.destroy();
      pairs.delete(pair);
    };
    client.on('error', end).on('close', end);
    server.on('error', end).on('close', end);
    client.on('data', (chunk) => {
      if (pair.silent) return;
      if (cut && chunk.includes(cut.marker)) pair.cutting = true;
      if (delay && chunk.includes(delay.marker)) {
        // Everything the server sends from here waits `ms` (in order, behind earlier held chunks).
        const ms = delay.ms;
        pair.held = pair.held.then(() => new Promise((resolve) => setTimeout(resolve, ms)));
        pair.delaying = true;
      }
      server.write(chunk);
    });
    server.on('data', (chunk) => {
      if (pair.silent) return;
      if (pair.cutting) {
        if (chunk.includes(readyForQuery)) {
          const done = cut!.done;
          cut = null;
          end();
          done();
        }
        return;
      }
      if (pair.delaying || pair.waiting > 0) {
        pair.waiting++;
        pair.held = pair.held.then(() => {
          pair.waiting--;
          client.write(chunk);
        });
        if (chunk.includes(readyForQuery)) pair.delaying = false;
        return;
      }
      client.write(chunk);
    });
  });
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  const url = new URL(databaseUrl);
  url.hostname = '127.0.0.1';
  url.port = String((proxy.address() as net.AddressInfo).port);
  return {
    url: url.href,
    blackHole() {
      silent = true;
      for (const pair of pairs) pair.silent = true;
    },
    heal() {
      silent = false;
    },
    delayRepliesTo(marker, ms) {
      delay = ms > 0 ? { marker: Buffer.from(marker), ms } : null;
    },
    cutAfterReplyTo(marker) {
      return new Promise((resolve) => {
        cut = { marker: Buffer.from(marker), done: resolve };
      });
    },
    async close() {
      for (const pair of pairs) {
        pair.client.destroy();
        pair.server.destroy();
      }
      await new Promise((resolve) => proxy.close(resolve));
    },
  };
}
