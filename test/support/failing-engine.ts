/**
 * A real HTTP listener standing in for an engine that fails: it answers every POST the way it is told
 * (`500`, an out-of-memory body, an engine-dead body, a 400, a success, or a dropped connection),
 * optionally after a delay, and counts the requests it receives. The breaker tests point a model's
 * static engine URL at it and count what reaches it.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { ModelConfig } from '../../src/config/index.ts';

export type FailingMode = 'ok' | '500' | 'oom' | 'dead' | '400' | 'drop';

export interface FailingEngine {
  readonly url: string;
  /** POSTs received so far. */
  readonly received: number;
  mode: FailingMode;
  /** Milliseconds to wait before answering. */
  delayMs: number;
  close(): Promise<void>;
}

const completion = JSON.stringify({
  id: 'cmpl-failing-engine',
  object: 'text_completion',
  created: 0,
  model: 'svc/failing',
  choices: [{ index: 0, text: 'ok', logprobs: null, finish_reason: 'length' }],
  usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 },
});

const answers: Record<Exclude<FailingMode, 'drop'>, { status: number; body: string }> = {
  ok: { status: 200, body: completion },
  '500': { status: 500, body: JSON.stringify({ error: { message: 'internal failure', type: 'InternalServerError', param: null, code: 500 } }) },
  oom: { status: 500, body: JSON.stringify({ error: { message: 'CUDA out of memory', type: 'OutOfMemoryError', param: null, code: 500 } }) },
  dead: { status: 503, body: JSON.stringify({ error: { message: 'engine loop is dead', type: 'EngineDeadError', param: null, code: 503 } }) },
  '400': { status: 400, body: JSON.stringify({ error: { message: 'bad steering layer', type: 'BadRequestError', param: 'steering', code: 400 } }) },
};

export async function startFailingEngine(mode: FailingMode = '500'): Promise<FailingEngine> {
  let received = 0;
  const state = { mode, delayMs: 0 };
  // Delayed answers not yet sent: cleared at close, so a test's process need not wait out a long delay to exit.
  const waiting = new Set<NodeJS.Timeout>();
  const server: Server = createServer((req, res) => {
    req.resume();
    req.once('end', () => {
      if (req.method !== 'POST') {
        res.writeHead(404).end();
        return;
      }
      received++;
      const answer = () => {
        if (state.mode === 'drop') return req.socket.destroy();
        const { status, body } = answers[state.mode];
        res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) }).end(body);
      };
      if (state.delayMs > 0) {
        const timer = setTimeout(() => {
          waiting.delete(timer);
          answer();
        }, state.delayMs);
        waiting.add(timer);
      } else answer();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    get received() {
      return received;
    },
    get mode() {
      return state.mode;
    },
    set mode(m) {
      state.mode = m;
    },
    get delayMs() {
      return state.delayMs;
    },
    set delayMs(ms) {
      state.delayMs = ms;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const timer of waiting) clearTimeout(timer);
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** A model served by a static engine URL (the `static` platform: always on), byte tokenizer, known context. */
export function staticModel(url: string, id = 'flaky'): ModelConfig {
  return {
    id,
    default: true,
    checkpoint: `svc/${id}`,
    engine: url,
    gpu_shape: 'test-gpu',
    cost_per_second: 0,
    tokenizer: { kind: 'byte' },
    capabilities: {
      max_model_len: 4096,
      max_logprobs: 20,
      prompt_logprobs_full_vocab: false,
      full_vocab_max_prompt_tokens: 1024,
      max_output_work_tokens: 32000,
      max_inflight_per_key: 16,
      max_queued_per_key: 64,
      rate_limit_per_minute: 600,
    },
    activations: null,
  };
}
