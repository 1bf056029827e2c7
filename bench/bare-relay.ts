// Two bare HTTP relays in one process, for scale in the capture bench: what any Node.js relay costs on
// this machine, before a gateway does anything of its own. `/pipe/...` streams the engine's response
// to the client as it arrives (no check of any kind; a short capture would pass as a 200);
// `/buffer/...` holds the whole body, then sends it (what a relay that must judge the whole capture
// before its status line does). Both with node:http on both sides and keep-alive.
// Run: node --import tsx bench/bare-relay.ts <engine-url>; prints {"event":"listening","url"}.
import { createServer, request, Agent, type IncomingMessage } from 'node:http';
import { pipeline } from 'node:stream/promises';

const engine = new URL(process.argv[2]);
const agent = new Agent({ keepAlive: true, maxSockets: 16 });

function upstream(path: string, body: Buffer): Promise<IncomingMessage> {
  return new Promise((resolve, reject) => {
    const req = request({ host: engine.hostname, port: engine.port, path, method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': body.length } }, resolve);
    req.once('error', reject);
    req.end(body);
  });
}

const server = createServer(async (req, res) => {
  const chunks: Buffer[] = [];
  for await (const chunk of req) chunks.push(chunk as Buffer);
  const [, mode, ...rest] = (req.url ?? '/').split('/');
  try {
    const answer = await upstream(`/${rest.join('/')}`, Buffer.concat(chunks));
    if (mode === 'pipe') {
      res.writeHead(answer.statusCode ?? 502, { 'content-type': 'application/json', ...(answer.headers['content-length'] ? { 'content-length': answer.headers['content-length'] } : {}) });
      await pipeline(answer, res);
      return;
    }
    const held: Buffer[] = [];
    let length = 0;
    for await (const chunk of answer) {
      held.push(chunk as Buffer);
      length += (chunk as Buffer).length;
    }
    res.writeHead(answer.statusCode ?? 502, { 'content-type': 'application/json', 'content-length': length });
    res.cork();
    for (const chunk of held) res.write(chunk);
    res.uncork();
    res.end();
  } catch {
    res.destroy();
  }
});
server.listen(0, '127.0.0.1', () => {
  const { port } = server.address() as { port: number };
  process.stdout.write(`${JSON.stringify({ event: 'listening', url: `http://127.0.0.1:${port}` })}\n`);
});
