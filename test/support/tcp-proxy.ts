/**
 * A TCP proxy in front of PostgreSQL that a test controls, to take a database away from a process (or
 * slow its answers down) without touching the server that other tests share:
 * - `cut()` resets every connection and every new one (a server that went down);
 * - `blackHole()` keeps connections open and silent, new ones too (a network that stopped delivering);
 * - `heal()` forwards new connections again, the black-holed ones stay silent; `restore()` forwards
 *   again and resets the held ones (a network that comes back after a long partition finds them dead);
 * - `cutAfterReplyTo(marker)` cuts the next connection that sends `marker` once its statement committed;
 * - `delayRepliesTo(marker, ms)` holds back the server's answers to statements containing `marker`.
 */
import net from 'node:net';

export type ProxyMode = 'forward' | 'cut' | 'blackhole';

export interface TcpProxy {
  /** The database URL with the proxy's address in place of the server's. */
  readonly url: string;
  readonly port: number;
  readonly mode: ProxyMode;
  /** Connections accepted and forwarded so far. */
  readonly forwarded: number;
  cut(): void;
  blackHole(): void;
  heal(): void;
  restore(): void;
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

interface Pair {
  client: net.Socket;
  server: net.Socket;
  silent: boolean;
  cutting: boolean;
  /** Answers are being held back (delayRepliesTo) until the next ReadyForQuery. */
  delaying: boolean;
  /** The chain that writes held-back answers in order, and how many wait on it. */
  held: Promise<void>;
  waiting: number;
}

export async function startTcpProxy(databaseUrl: string): Promise<TcpProxy> {
  const target = new URL(databaseUrl);
  const pairs = new Set<Pair>();
  let mode: ProxyMode = 'forward';
  let forwarded = 0;
  let cut: { marker: Buffer; done(): void } | null = null;
  let delay: { marker: Buffer; ms: number } | null = null;
  const end = (pair: Pair) => {
    pair.client.resetAndDestroy();
    pair.server.resetAndDestroy();
    pairs.delete(pair);
  };
  const proxy = net.createServer((client) => {
    client.on('error', () => {});
    if (mode === 'cut') return void client.resetAndDestroy();
    const server = net.connect(Number(target.port || 5432), target.hostname);
    const pair: Pair = { client, server, silent: mode === 'blackhole', cutting: false, delaying: false, held: Promise.resolve(), waiting: 0 };
    if (!pair.silent) forwarded++;
    pairs.add(pair);
    client.on('close', () => end(pair));
    server.on('error', () => end(pair)).on('close', () => end(pair));
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
          end(pair);
          done();
        }
        return;
      }
      if (pair.delaying || pair.waiting > 0) {
        pair.waiting++;
        pair.held = pair.held.then(() => {
          pair.waiting--;
          if (!pair.silent) client.write(chunk);
        });
        if (chunk.includes(readyForQuery)) pair.delaying = false;
        return;
      }
      client.write(chunk);
    });
  });
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  const port = (proxy.address() as net.AddressInfo).port;
  const url = new URL(databaseUrl);
  url.hostname = '127.0.0.1';
  url.port = String(port);
  return {
    url: url.href,
    port,
    get mode() {
      return mode;
    },
    get forwarded() {
      return forwarded;
    },
    cut() {
      mode = 'cut';
      for (const pair of [...pairs]) end(pair);
    },
    blackHole() {
      mode = 'blackhole';
      // Bytes already under way are delivered; nothing after them, either way.
      for (const pair of pairs) pair.silent = true;
    },
    heal() {
      mode = 'forward';
    },
    restore() {
      for (const pair of [...pairs]) if (pair.silent) end(pair);
      mode = 'forward';
    },
    cutAfterReplyTo(marker) {
      return new Promise((resolve) => {
        cut = { marker: Buffer.from(marker), done: resolve };
      });
    },
    delayRepliesTo(marker, ms) {
      delay = ms > 0 ? { marker: Buffer.from(marker), ms } : null;
    },
    async close() {
      mode = 'cut';
      for (const pair of [...pairs]) end(pair);
      await new Promise((resolve) => proxy.close(resolve));
    },
  };
}
