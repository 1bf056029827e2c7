// Two bare HTTP relays in one process, the capture bench's floors: what any Node.js relay costs on this
// machine, before a gateway does anything of its own. Both are plain node:http on both sides with
// keep-alive, reading with 'data' listeners (no async iteration, which pulls one chunk at a time).
// `/hold/...` collects the engine's chunks and answers with one `end()` of their concatenation once the
// engine's body has ended: what a relay that must judge the whole capture before its status line does
// at the least (the contract's floor for captures). `/pipe/...` streams the engine's response to the
// client as it arrives (no check of any kind; a short capture would pass as a 200), for scale.
// Neither compresses, whatever the client's Accept-Encoding.
// Run: node --import tsx bench/bare-relay.ts <engine-url>; prints {"event":"listening","url"}.
import { createServer, request, Agent, type IncomingMessage } from 'node:http';

const engine = new URL(process.argv[2]);
const agent = new Agent({ keepAlive: true, maxSockets: 16 });

function upstream(path: string, body: Buffer): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const req = request({ host: engine.hostname, port: engine.port, path, method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': body.length } }, resolve);
    req.once('error', reject);
    req.end(body);
  });
}

const server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (chunk: Buffer) => chunks.push(chunk));
  req.once('end', () => {
    const [, mode, ...rest] = (req.url ?? '/').split('/');
    upstream(`/${rest.join('/')}`, Buffer.concat(chunks)).then(
      (answer) => {
        if (mode === 'pipe') {
          res.writeHead(answer.statusCode ?? 502, { 'content-type': 'application/json', ...(answer.headers['content-length'] ? { 'content-length': answer.headers['content-length'] } : {}) });
          answer.pipe(res);
          return;
        }
        const held: Buffer[] = [];
        answer.on('data', (chunk: Buffer) => held.push(chunk));
        answer.once('end', () => {
          const body = Buffer.concat(held);
          res.writeHead(answer.statusCode ?? 502, { 'content-type': 'application/json', 'content-length': body.length });
          res.end(body);
        });
        answer.once('error', () => res.destroy());
      },
      () => res.destroy(),
    );
  });
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => {
  const { port } = server.address() as { port: number };
  process.stdout.write(`${JSON.stringify({ event: 'listening', url: `http://127.0.0.1:${port}` })}\n`);
});
process.on('SIGTERM', () => {
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
