/**
 * A TCP proxy a test controls, to take a database away from a process without stopping the server
 * that other tests share: `cut()` resets every connection and every new one (a server that went down),
 * `blackhole()` keeps connections open and silent (a network that stopped delivering), `restore()`
 * forwards again (held connections are reset, as a network that comes back after a long partition
 * finds them dead).
 */
import { createServer, connect, type Server, type Socket } from 'node:net';
import { once } from 'node:events';

export type ProxyMode = 'forward' | 'cut' | 'blackhole';

export interface TcpProxy {
  readonly port: number;
  readonly mode: ProxyMode;
  /** Connections accepted and forwarded so far. */
  readonly forwarded: number;
  cut(): void;
  blackhole(): void;
  restore(): void;
  close(): Promise<void>;
}

export async function startTcpProxy(target: { host: string; port: number }): Promise<TcpProxy> {
  let mode: ProxyMode = 'forward';
  let forwarded = 0;
  /** Each client socket with the server socket it is joined to (null while held in a black hole). */
  const pairs = new Map<Socket, Socket | null>();

  const drop = (client: Socket) => {
    const upstream = pairs.get(client);
    pairs.delete(client);
    client.resetAndDestroy();
    upstream?.resetAndDestroy();
  };

  const server: Server = createServer((client) => {
    client.on('error', () => {});
    if (mode === 'cut') return void client.resetAndDestroy();
    pairs.set(client, null);
    client.once('close', () => drop(client));
    if (mode === 'blackhole') return; // accepted, never answered
    forwarded++;
    const upstream = connect(target.port, target.host);
    upstream.on('error', () => drop(client));
    upstream.once('close', () => drop(client));
    pairs.set(client, upstream);
    client.pipe(upstream);
    upstream.pipe(client);
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as { port: number }).port;

  return {
    port,
    get mode() {
      return mode;
    },
    get forwarded() {
      return forwarded;
    },
    cut() {
      mode = 'cut';
      for (const client of [...pairs.keys()]) drop(client);
    },
    blackhole() {
      mode = 'blackhole';
      // Bytes already under way are delivered; nothing after them, either way.
      for (const [client, upstream] of pairs) {
        client.unpipe();
        upstream?.unpipe();
        client.pause();
        upstream?.pause();
      }
    },
    restore() {
      for (const client of [...pairs.keys()]) if (mode === 'blackhole') drop(client);
      mode = 'forward';
    },
    async close() {
      mode = 'cut';
      for (const client of [...pairs.keys()]) drop(client);
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
