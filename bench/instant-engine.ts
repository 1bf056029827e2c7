// A vLLM-shaped engine that answers at once, for measuring what the gateway itself adds. Benchmarks
// only: the tests talk to the real reference engine. Run as a child process; prints its URL as JSON.
// `instant-engine.ts CHECKPOINT [DELAY_MS]`: with a delay, every answer waits that long first (an engine
// that takes 20 ms, for the added-latency figure against a working engine).
import { createServer } from 'node:http';

const checkpoint = process.argv[2] ?? 'bench/instant';
const delayMs = Number(process.argv[3] ?? 0) || 0;
const completion = JSON.stringify({
  id: 'cmpl-0123456789abcdef',
  object: 'text_completion',
  created: 1_700_000_000,
  model: checkpoint,
  choices: [{ index: 0, text: ' the quick brown fox jumps over the lazy dog', logprobs: null, finish_reason: 'length', stop_reason: null, prompt_logprobs: null }],
  usage: { prompt_tokens: 5, completion_tokens: 16, total_tokens: 21 },
});
const frames = ['the', ' quick', ' brown', ' fox']
  .map((t, i) => `data: ${JSON.stringify({ id: 'cmpl-1', object: 'text_completion', created: 1, model: checkpoint, choices: [{ index: 0, text: t, logprobs: null, finish_reason: i === 3 ? 'length' : null, stop_reason: null }] })}\n\n`)
  .join('') + 'data: [DONE]\n\n';

// One ~64 KiB slice of a full-vocabulary prompt_logprobs body, repeated to reach the requested size.
const entry = (id: number) => `"${id}":{"logprob":-10.8${id % 10},"rank":${id + 1},"decoded_token":"tok${id}"}`;
const slice = Buffer.from(Array.from({ length: 900 }, (_, i) => entry(i)).join(',') + ',');

const server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on('data', (c) => chunks.push(c));
  let receivedAt = 0;
  req.on('end', () => {
    receivedAt = performance.timeOrigin + performance.now();
    if (delayMs > 0) setTimeout(answer, delayMs);
    else answer();
  });
  const answer = () => {
    const body = JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
    if (body.stream) {
      res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8' });
      res.end(frames);
      return;
    }
    const fullVocabBytes = Number(body.user_bench_bytes ?? 0) || (body.prompt_logprobs === -1 ? 1024 ** 3 : 0);
    if (fullVocabBytes > 0) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write(`{"id":"cmpl-big","object":"text_completion","created":1,"model":"${checkpoint}","choices":[{"index":0,"text":"","prompt_logprobs":[null,{`);
      let sent = 0;
      const pump = () => {
        while (sent < fullVocabBytes) {
          sent += slice.length;
          if (!res.write(slice)) return res.once('drain', pump);
        }
        res.end(`"x":{"logprob":0,"rank":1,"decoded_token":"x"}}],"finish_reason":"length","stop_reason":null,"logprobs":null}],"usage":{"prompt_tokens":1024,"completion_tokens":1,"total_tokens":1025}}`);
      };
      pump();
      return;
    }
    // With a delay, the answer says when the request arrived and when it was answered (epoch ms, this
    // process's clock): the bench splits a request's time into before the engine and after it.
    const answerBody = delayMs > 0 ? `${completion.slice(0, -1)},"bench_received_at":${receivedAt},"bench_answered_at":${performance.timeOrigin + performance.now()}}` : completion;
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(answerBody) });
    res.end(answerBody);
  };
});
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => {
  const address = server.address() as { port: number };
  process.stdout.write(`${JSON.stringify({ event: 'listening', url: `http://127.0.0.1:${address.port}` })}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
