// The reference engine: a CPU transformer with dummy weights speaking vLLM's (+ vllm-lens) wire protocol.
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';
import type { AddressInfo } from 'node:net';
import { svcCommand, type ModelConfig } from '../config/index.ts';
import { loadTokenizer } from '../tokenizer/index.ts';
import { Model } from './model.ts';
import { Generator } from './generate.ts';
import { createEngineServer } from './server.ts';
import type { ChaosMode } from './chaos.ts';

export type { ChaosMode } from './chaos.ts';

export interface ReferenceEngineOptions {
  host?: string;
  port?: number;
  chaos?: boolean;
  /** Slow boot: wait this long before listening (chaos). Defaults to SVC_ENGINE_BOOT_DELAY_MS when chaos is on. */
  bootDelayMs?: number;
  /** `crash` chaos exits the process (the CLI); otherwise the in-process engine drops every connection. */
  exitOnCrash?: boolean;
  /** Failed boot: throw after the boot delay instead of listening (the platforms' boot-failure tests). */
  bootFail?: boolean;
  /** With `chaos`: the first completion fails this way (as if `POST /_chaos {mode}` came before it). */
  chaosMode?: ChaosMode;
  /** Told when the weights start and finish loading (the boot delay counts as loading), for a platform's boot stages. */
  onStage?: (stage: 'weights_loading' | 'weights_loaded') => void;
}

export interface RunningEngine {
  url: string;
  close(): Promise<void>;
}

/** Builds the model and starts serving it in this process (tests, the CLI). */
export async function startReferenceEngine(model: ModelConfig, opts: ReferenceEngineOptions = {}): Promise<RunningEngine> {
  const arch = model.architecture;
  if (!arch) throw new Error(`model ${model.id} has no architecture: it cannot run on the reference engine`);
  opts.onStage?.('weights_loading');
  const tokenizer = await loadTokenizer(model.tokenizer);
  const maxModelLen = model.capabilities.max_model_len ?? 2048;
  const net = new Model({
    vocabSize: tokenizer.vocabSize,
    nLayers: arch.n_layers,
    dModel: arch.d_model,
    nHeads: arch.n_heads,
    dMlp: arch.d_mlp,
    maxLen: maxModelLen,
    seed: arch.seed,
    eosId: tokenizer.eosId,
    bosId: tokenizer.bosId,
  });
  const generator = new Generator(net, tokenizer, maxModelLen);
  const engine = createEngineServer({
    generator,
    checkpoint: model.checkpoint,
    limits: { maxModelLen, maxLogprobs: model.capabilities.max_logprobs, nLayers: arch.n_layers, dModel: arch.d_model },
    chaos: opts.chaos === true,
    chaosMode: opts.chaosMode,
    captureCompression: model.activations?.capture_compression === 'zstd' ? 'zstd' : null,
    onCrash: opts.exitOnCrash ? () => process.exit(70) : undefined,
  });
  const envDelay = Number(process.env.SVC_ENGINE_BOOT_DELAY_MS ?? 0);
  const bootDelay = opts.bootDelayMs ?? (opts.chaos && envDelay > 0 ? envDelay : 0);
  if (bootDelay > 0) await new Promise((r) => setTimeout(r, bootDelay));
  if (opts.bootFail) throw new Error(`model ${model.id}: the boot was told to fail (--boot-fail)`);
  opts.onStage?.('weights_loaded');
  const host = opts.host ?? '127.0.0.1';
  await new Promise<void>((resolve, reject) => {
    engine.server.once('error', reject);
    engine.server.listen(opts.port ?? 0, host, () => {
      engine.server.off('error', reject);
      resolve();
    });
  });
  const { port } = engine.server.address() as AddressInfo;
  return { url: `http://${host.includes(':') ? `[${host}]` : host}:${port}`, close: () => engine.close() };
}

export interface SpawnedEngine {
  url: string;
  pid: number;
  stop(): Promise<void>;
  /** Resolves with the exit code (null when killed by a signal). */
  exited: Promise<number | null>;
}


/** Runs `svc engine --model <id> --port 0` as a child process and resolves once it listens. */
export function spawnReferenceEngine(
  modelId: string,
  opts: {
    configPath: string | null;
    chaos?: boolean;
    env?: NodeJS.ProcessEnv;
    bootDelayMs?: number;
    /** The process exits before listening, after its boot delay (a failed boot). */
    bootFail?: boolean;
    /** The process waits this long before it reports `container_started` (a boot that stalls before the platform acknowledges it). */
    startStallMs?: number;
    /** With `chaos`: the engine's first completion fails this way (`--chaos-mode`). */
    chaosMode?: ChaosMode;
    /** Each boot stage the process reports on stdout before it listens. */
    onStage?: (stage: 'container_started' | 'weights_loading' | 'weights_loaded') => void;
    /** Aborted before the process listens: it is killed (a platform gave up on a stalled boot). */
    signal?: AbortSignal;
  },
): Promise<SpawnedEngine> {
  const args = [...svcCommand(), 'engine', '--model', modelId, '--port', '0'];
  if (opts.chaos) args.push('--chaos');
  if (opts.bootDelayMs) args.push('--boot-delay-ms', String(opts.bootDelayMs));
  if (opts.bootFail) args.push('--boot-fail');
  if (opts.startStallMs) args.push('--start-stall-ms', String(opts.startStallMs));
  if (opts.chaosMode) args.push('--chaos-mode', opts.chaosMode);
  const env = { ...process.env, ...opts.env };
  if (opts.configPath) env.SVC_CONFIG = opts.configPath;
  const child = spawn(process.execPath, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const abandon = () => child.kill('SIGKILL');
  opts.signal?.addEventListener('abort', abandon, { once: true });
  void exited.then(() => opts.signal?.removeEventListener('abort', abandon));
  let stderr = '';
  child.stderr!.setEncoding('utf8');
  child.stderr!.on('data', (d: string) => {
    stderr = (stderr + d).slice(-4000);
  });
  return new Promise<SpawnedEngine>((resolve, reject) => {
    const lines = createInterface({ input: child.stdout! });
    let settled = false;
    lines.on('line', (line) => {
      let msg: { event?: string; url?: string; stage?: string };
      try {
        msg = JSON.parse(line);
      } catch {
        return;
      }
      if (msg.event === 'stage' && !settled && (msg.stage === 'container_started' || msg.stage === 'weights_loading' || msg.stage === 'weights_loaded')) opts.onStage?.(msg.stage);
      if (msg.event === 'listening' && typeof msg.url === 'string' && !settled) {
        settled = true;
        opts.signal?.removeEventListener('abort', abandon);
        resolve({
          url: msg.url,
          pid: child.pid!,
          exited,
          stop: async () => {
            if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
            const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
            await exited;
            clearTimeout(timer);
          },
        });
      }
    });
    void exited.then((code) => {
      if (!settled) {
        settled = true;
        reject(new Error(`reference engine for ${modelId} exited with ${code} before listening: ${stderr.trim()}`));
      }
    });
    child.once('error', (err) => {
      if (!settled) {
        settled = true;
        reject(err);
      }
    });
  });
}
