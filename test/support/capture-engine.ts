// A stub activation engine: a separate HTTP process speaking the engine protocol (ENGINE.md) that answers
// captures at once, at any size, laid out as vLLM + vllm-lens write them (`activations` last, the codec's
// `data` before its `shape`). The capture spans the prompt's positions (its token ids, or its bytes + 1
// for BOS) + max_tokens - 1, of D_MODEL bf16 values per requested layer.
// By default its tensor is a repeated base64 block, so a 610 MB body costs no memory, and the prompt's
// first word picks a behaviour:
//   whole        every requested layer
//   fewer        one layer less than requested
//   malformed    an envelope whose small fields are not JSON (`"dtype":int16`)
//   none         no activations key at all (a stock vLLM ignores the capture)
//   break        the connection drops half-way through the data
//   first        `activations` first, the rest of the completion after it (another engine's order)
// The tensor's base64 goes out in writes of 256 KiB, or with `layer` one write per layer (about 0.7 MB
// for 129 positions), as an engine that serialises layer by layer does.
// With `random` (the harvest bench) every capture is whole and holds finite random bf16 (the exponent
// within ±2^15, as activations are): bodies are made once per shape, three that differ, kept and sent
// in one write each, so the engine costs a write of bytes already in memory.
// Run: node --import tsx test/support/capture-engine.ts [checkpoint] [layer] [random] [d_model=2048]
// [n_layers=16]; prints {"event":"listening","url"}.
import { randomFillSync } from 'node:crypto';
import { createServer, type ServerResponse } from 'node:http';

const checkpoint = process.argv[2] ?? 'stub/capture-16l-2048d';
const options = process.argv.slice(3);
const setting = (name: string, fallback: number) => Number(options.find((o) => o.startsWith(`${name}=`))?.slice(name.length + 1) ?? fallback);
const D_MODEL = setting('d_model', 2048);
const N_LAYERS = setting('n_layers', 16);
const perLayer = options.includes('layer');
const random = options.includes('random');

// 3 × 64 Ki bytes of varied bf16-like patterns: base64 of a multiple of 3 bytes has no padding, so copies
// of the block concatenate into valid base64 of their concatenated bytes.
const BLOCK_RAW = 3 * 65_536;
const blockRaw = Buffer.alloc(BLOCK_RAW);
for (let i = 0; i < BLOCK_RAW; i++) blockRaw[i] = (i * 2654435761) >>> 24;
const block = Buffer.from(blockRaw.toString('base64'));

/** Copies of `block` covering `bytes` from any offset in it: the data is periodic, so any slice of it is data. */
const rings = new Map<number, Buffer>();
function ringFor(bytes: number): Buffer {
  let ring = rings.get(bytes);
  if (!ring) {
    ring = Buffer.concat(Array.from({ length: Math.ceil(bytes / block.length) + 1 }, () => block));
    rings.set(bytes, ring);
  }
  return ring;
}

function layersOf(body: Record<string, any>): number {
  const value = body.vllm_xargs?.output_residual_stream ?? body.output_residual_stream;
  if (value === undefined) return 0;
  const parsed = typeof value === 'string' ? JSON.parse(value) : value;
  return parsed === true ? N_LAYERS : (parsed as number[]).length;
}

/** Writes with backpressure. */
async function write(res: ServerResponse, piece: Buffer | string): Promise<void> {
  if (!res.write(piece)) await new Promise<void>((resolve) => res.once('drain', resolve));
}

/** Random bodies of each shape ("layersxpositions"), made once; served in turn. */
const randomBodies = new Map<string, Buffer[]>();
let served = 0;

/** A whole capture of finite random bf16, `variant` making it differ from the others of its shape. */
function randomBody(head: string, layers: number, positions: number, variant: number): Buffer {
  const raw = Buffer.allocUnsafe(layers * positions * D_MODEL * 2);
  randomFillSync(raw);
  for (let i = 1; i < raw.length; i += 2) raw[i] = (raw[i] & 0x80) | (0x38 + ((raw[i] + variant) & 7));
  const close = `","dtype":"int16","original_dtype":"torch.bfloat16","shape":[${layers},${positions},${D_MODEL}],"compression":null}}}`;
  return Buffer.concat([Buffer.from(`${head},"activations":{"residual_stream":{"data":"`), Buffer.from(raw.toString('base64'), 'latin1'), Buffer.from(close)]);
}

async function capture(res: ServerResponse, body: Record<string, any>): Promise<void> {
  const prompt = Array.isArray(body.prompt) ? '' : String(body.prompt ?? '');
  const mode = random ? 'whole' : prompt.split(' ')[0];
  const requested = layersOf(body);
  const positions = (Array.isArray(body.prompt) ? body.prompt.length : Buffer.byteLength(prompt) + 1) + Number(body.max_tokens ?? 1) - 1;
  const layers = mode === 'fewer' ? requested - 1 : requested;
  const rawBytes = layers * positions * D_MODEL * 2;
  const whole = Math.floor(rawBytes / BLOCK_RAW);
  const tail = Buffer.from(blockRaw.subarray(0, rawBytes - whole * BLOCK_RAW).toString('base64'));
  const dataLength = whole * block.length + tail.length;
  const head = `{"id":"cmpl-stub","object":"text_completion","created":1700000000,"model":${JSON.stringify(checkpoint)},"choices":[{"index":0,"text":" \\"x\\" {y}","logprobs":null,"finish_reason":"length","stop_reason":null,"prompt_logprobs":null}],"usage":{"prompt_tokens":${positions},"total_tokens":${positions + 1},"completion_tokens":1}`;
  if (mode === 'none' || requested === 0) {
    const text = `${head}}`;
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
    res.end(text);
    return;
  }
  if (random) {
    const key = `${layers}x${positions}`;
    let made = randomBodies.get(key);
    if (!made) randomBodies.set(key, (made = [0, 1, 2].map((variant) => randomBody(head, layers, positions, variant))));
    const answer = made[served++ % made.length];
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': answer.length });
    res.end(answer);
    return;
  }
  const first = mode === 'first';
  const open = `${first ? '{' : `${head},`}"activations":{"residual_stream":{"data":"`;
  const dtype = mode === 'malformed' ? 'int16' : '"int16"';
  const close = `","dtype":${dtype},"original_dtype":"torch.bfloat16","shape":[${layers},${positions},${D_MODEL}],"compression":null}}${first ? `,${head.slice(1)}` : ''}}`;
  res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(open) + dataLength + Buffer.byteLength(close) });
  await write(res, open);
  const periodic = whole * block.length;
  const stopAt = mode === 'break' ? Math.floor(whole / 2) * block.length : Infinity;
  const writeBytes = perLayer ? Math.max(1, Math.round(dataLength / Math.max(1, layers))) : block.length;
  const ring = perLayer ? ringFor(writeBytes) : block;
  for (let at = 0; at < periodic; at += writeBytes) {
    if (at >= stopAt) {
      res.destroy();
      return;
    }
    const offset = at % block.length;
    await write(res, ring.subarray(offset, offset + Math.min(writeBytes, periodic - at)));
  }
  await write(res, tail);
  res.end(close);
}

const server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    if (req.url === '/health') return void res.end();
    if (req.url === '/v1/models') {
      res.writeHead(200, { 'content-type': 'application/json' });
      return void res.end(JSON.stringify({ object: 'list', data: [{ id: checkpoint, object: 'model', created: 0, owned_by: 'stub', root: checkpoint, max_model_len: 32768 }] }));
    }
    if (req.method !== 'POST' || req.url !== '/v1/completions') {
      res.writeHead(404, { 'content-type': 'application/json' });
      return void res.end(JSON.stringify({ error: { message: 'not found', type: 'NotFoundError', param: null, code: 404 } }));
    }
    capture(res, JSON.parse(Buffer.concat(chunks).toString('utf8'))).catch(() => res.destroy());
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
