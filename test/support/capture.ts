// What the capture tests and the capture bench share: the stub activation engine as a child process, a
// model configuration pointing at it, and a client that hashes a response while it streams.
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { request, type Dispatcher } from 'undici';
import type { ModelConfig } from '../../src/config/index.ts';

const root = fileURLToPath(new URL('../..', import.meta.url));
export const STUB_CHECKPOINT = 'stub/capture-16l-2048d';
export const STUB_LAYERS = 16;
export const STUB_D_MODEL = 2048;

export interface CaptureStub {
  url: string;
  child: ChildProcess;
  stop(): Promise<void>;
}

/** Starts test/support/capture-engine.ts in its own process. */
export async function startCaptureStub(): Promise<CaptureStub> {
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/support/capture-engine.ts', STUB_CHECKPOINT], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] });
  const url = await new Promise<string>((resolve, reject) => {
    child.once('exit', (code) => reject(new Error(`the capture stub exited ${code}`)));
    createInterface({ input: child.stdout! }).on('line', (line) => {
      if (line.includes('"listening"')) resolve(JSON.parse(line).url);
    });
  });
  return {
    url,
    child,
    stop: () =>
      new Promise<void>((resolve) => {
        if (child.exitCode !== null) return resolve();
        child.once('exit', () => resolve());
        child.kill('SIGTERM');
      }),
  };
}

/** A 16-layer, 2048-wide activation model served by the stub; captures up to 8,192 positions of all layers. */
export function stubModel(url: string, activations: Partial<NonNullable<ModelConfig['activations']>> = {}): ModelConfig {
  return {
    id: 'stub',
    default: true,
    checkpoint: STUB_CHECKPOINT,
    engine: url,
    gpu_shape: 'stub',
    cost_per_second: 0,
    tokenizer: { kind: 'byte' },
    capabilities: {
      max_model_len: 32768,
      max_logprobs: 100,
      prompt_logprobs_full_vocab: true,
      full_vocab_max_prompt_tokens: 1024,
      max_output_work_tokens: 32000,
      max_inflight_per_key: 16,
      max_queued_per_key: 64,
      rate_limit_per_minute: 600,
    },
    activations: { n_layers: STUB_LAYERS, d_model: STUB_D_MODEL, max_steering_vectors: 8, max_activation_prompt_tokens: 8192, ...activations },
  };
}

/**
 * A capture request whose response spans `positions` positions: the stub's behaviour word, padded with
 * spaces to `positions` prompt tokens (byte tokenizer plus BOS), and max_tokens 1.
 */
export function captureRequest(mode: 'whole' | 'fewer' | 'malformed' | 'none' | 'break' | 'first', positions: number, layers: true | number[] = true): Record<string, unknown> {
  return { prompt: mode.padEnd(positions - 1, ' '), max_tokens: 1, temperature: 0, output_residual_stream: layers };
}

/** What the gateway sends the engine for `captureRequest` (enough for the stub): to fetch the same body directly. */
export function engineCaptureBody(req: Record<string, unknown>): string {
  const layers = req.output_residual_stream;
  return JSON.stringify({
    model: STUB_CHECKPOINT,
    prompt: req.prompt,
    max_tokens: req.max_tokens,
    temperature: 0,
    stream: false,
    vllm_xargs: { output_residual_stream: layers === true ? 'true' : JSON.stringify(layers) },
  });
}

export interface HashedResponse {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  bytes: number;
  sha256: string;
  /** The first bytes of the body (an error body whole). */
  head: string;
}

/** POSTs and hashes the response while it streams: the body is never held. */
export async function postHashed(url: string, body: string, dispatcher?: Dispatcher, headers: Record<string, string> = {}): Promise<HashedResponse> {
  const res = await request(url, { method: 'POST', body, headers: { 'content-type': 'application/json', ...headers }, dispatcher });
  const hash = createHash('sha256');
  let bytes = 0;
  let head = '';
  for await (const chunk of res.body) {
    hash.update(chunk as Buffer);
    if (head.length < 4096) head += (chunk as Buffer).subarray(0, 4096 - head.length).toString('latin1');
    bytes += (chunk as Buffer).length;
  }
  return { status: res.statusCode, headers: res.headers, bytes, sha256: hash.digest('hex'), head };
}
