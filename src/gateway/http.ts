/** The gateway's HTTP server around the app: its connections, its drain on close, and /health's store ping. */
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { FastifyInstance } from 'fastify';
import type { EventStore } from '../store/index.ts';

/** The SQL store's ping and the EventStoreDB log's (when the log is apart): ok when both are, the slower one's latency. */
export async function pingBoth(store: EventStore, log: { ping(timeoutMs: number): Promise<{ ok: boolean; latencyMs: number }> } | null, timeoutMs: number): Promise<{ ok: boolean; latencyMs: number }> {
  const pings = await Promise.all([store.ping(timeoutMs), ...(log ? [log.ping(timeoutMs)] : [])]);
  return { ok: pings.every((p) => p.ok), latencyMs: Math.max(...pings.map((p) => p.latencyMs)) };
}

/**
 * Stops accepting, lets in-flight requests finish (up to `graceMs`), and closes keep-alive connections
 * as soon as they fall idle, so a client's pooled connection does not hold the process open.
 */
export async function drainAndClose(app: FastifyInstance, graceMs: number, connections: { closeUnused(): void }): Promise<void> {
  const idleSweep = setInterval(() => {
    app.server.closeIdleConnections();
    connections.closeUnused();
  }, 50);
  const force = setTimeout(() => app.server.closeAllConnections(), graceMs);
  try {
    await app.close();
  } finally {
    clearInterval(idleSweep);
    clearTimeout(force);
  }
}

/**
 * The server's sockets, each with the number of its responses under way. Node counts a connection on
 * which no request has arrived yet as busy until its headersTimeout (60 s), and closeIdleConnections
 * leaves it open: a client's spare connection (undici opens one after an aborted fetch) held the
 * drain for the whole grace. `closeUnused` closes every socket with no response under way.
 */
export function trackConnections(server: FastifyInstance['server']): { closeUnused(): void } {
  const open = new Map<Socket, number>();
  server.on('connection', (socket: Socket) => {
    open.set(socket, 0);
    socket.once('close', () => open.delete(socket));
  });
  server.on('request', (request: IncomingMessage, response: ServerResponse) => {
    const socket = request.socket;
    open.set(socket, (open.get(socket) ?? 0) + 1);
    response.once('close', () => {
      const n = open.get(socket);
      if (n !== undefined) open.set(socket, n - 1);
    });
  });
  return { closeUnused: () => open.forEach((n, socket) => n <= 0 && socket.destroy()) };
}
