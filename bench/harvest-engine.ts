// A stub activation engine for the harvest bench: answers every capture at once with random bf16 of the
// asked shape ([layers asked, prompt token ids, D_MODEL]), laid out as vLLM + vllm-lens write it. Bodies
// are made once per shape and kept (the engine then costs a write of bytes already in memory), from a
// few random blocks so that captures differ. Run: node --import tsx bench/harvest-engine.ts CHECKPOINT
// D_MODEL N_LAYERS; prints {"event":"listening","url"}.
import { randomFillSync } from 'node:crypto';
import { createServer } from 'node:http';

const checkpoint = process.argv[2] ?? 'bench/harvest';
const dModel = Number(process.argv[3] ?? 2048);
const nLayers = Number(process.argv[4] ?? 16);
const variants = 3;
const bodies = new Map<string, Buffer[]>();
let served = 0;

function layersOf(body: Record<string, any>): number {
  const value = body.vllm_xargs?.output_residual_stream ?? body.output_residual_stream;
  if (value === undefined) return 0;
  const parsed = typeof value === 'string' ? JSON.parse(value) : value;
  return parsed === true ? nLayers : (parsed as number[]).length;
}

function captureBody(layers: number, positions: number, variant: number): Buffer {
  const raw = Buffer.allocUnsafe(layers * positions * dModel * 2);
  randomFillSync(raw);
  // Finite bf16 values (no NaN or infinity): the exponent kept within ±2^15, as activations are.
  for (let i = 1; i < raw.length; i += 2) raw[i] = (raw[i] & 0x80) | (0x38 + ((raw[i] + variant) & 7));
  const head = `{"id":"cmpl-bench","object":"text_completion","created":1,"model":${JSON.stringify(checkpoint)},"choices":[{"index":0,"text":" ","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}],"usage":{"prompt_tokens":${positions},"completion_tokens":1,"total_tokens":${positions + 1}},"activations":{"residual_stream":{"data":"`;
  const tail = `","dtype":"int16","original_dtype":"torch.bfloat16","shape":[${layers},${positions},${dModel}],"compression":null}}}`;
  return Buffer.concat([Buffer.from(head), Buffer.from(raw.toString('base64'), 'latin1'), Buffer.from(tail)]);
}

const server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    if (req.url === '/health') return void res.end();
    if (req.url === '/v1/models') {
      res.writeHead(200, { 'content-type': 'application/json' });
      return void res.end(JSON.stringify({ object: 'list', data: [{ id: checkpoint, object: 'model', created: 0, owned_by: 'bench', root: checkpoint, max_model_len: 32768 }] }));
    }
    if (req.method !== 'POST' || req.url !== '/v1/completions') {
      res.writeHead(404, { 'content-type': 'application/json' });
      return void res.end(JSON.stringify({ error: { message: 'not found', type: 'NotFoundError', param: null, code: 404 } }));
    }
    const body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    const positions = Array.isArray(body.prompt) ? body.prompt.length : Buffer.byteLength(String(body.prompt)) + 1;
    const key = `${layersOf(body)}x${positions}`;
    let made = bodies.get(key);
    if (!made) bodies.set(key, (made = Array.from({ length: variants }, (_, v) => captureBody(layersOf(body), positions, v))));
    const answer = made[served++ % variants];
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': answer.length });
    res.end(answer);
  });
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => {
  const address = server.address() as { port: number };
  process.stdout.write(`${JSON.stringify({ event: 'listening', url: `http://127.0.0.1:${address.port}` })}\n`);
});
process.on('SIGTERM', () => {
  server.closeAllConnections();
  server.close(() => process.exit(0));
});
