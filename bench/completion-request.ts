// prepareCompletion on the hot path: validation + model lookup + tokenization + engine body, per request.
// Run: node --import tsx bench/completion-request.ts
import { loadSettings } from '../src/config/index.ts';
import { ModelRegistry } from '../src/registry/index.ts';
import { prepareCompletion, type CompletionContext } from '../src/completion-request/index.ts';

const settings = loadSettings({});
const registry = new ModelRegistry(settings.models);
await registry.loadTokenizers();
const ctx: CompletionContext = { registry, requestWindowMs: settings.requestWindowMs, deadlineTokensPerSecond: settings.deadlineTokensPerSecond };

const english = 'The quick brown fox jumps over the lazy dog. '.repeat(40); // ~400 r50k tokens
const cases: Array<{ name: string; body: string }> = [
  { name: 'small text, defaults (byte)', body: JSON.stringify({ prompt: 'Once upon a time', max_tokens: 16 }) },
  { name: 'small text, all sampling fields (r50k)', body: JSON.stringify({ model: 'ref-gpt2', prompt: 'Once upon a time', max_tokens: 16, temperature: 0.7, top_p: 0.9, top_k: 40, seed: 1, stop: ['\n'], logprobs: 5 }) },
  { name: '~1,800-char text (r50k)', body: JSON.stringify({ model: 'ref-gpt2', prompt: english, max_tokens: 16 }) },
  { name: '1,024 token ids', body: JSON.stringify({ prompt: Array.from({ length: 1024 }, (_, i) => i % 256), max_tokens: 16 }) },
  { name: 'steering vector 4x64 float32', body: JSON.stringify({ prompt: 'a', max_tokens: 4, apply_steering_vectors: [{ activations: { data: Buffer.alloc(4 * 64 * 4).toString('base64'), dtype: 'float32', shape: [4, 64] }, layer_indices: [0, 1, 2, 3] }] }) },
  { name: 'rejected: unknown field', body: JSON.stringify({ prompt: 'a', extra_body: {} }) },
  { name: 'rejected: temperature out of range', body: JSON.stringify({ prompt: 'a', temperature: 101 }) },
];

for (const c of cases) {
  const run = (iterations: number) => {
    const started = process.hrtime.bigint();
    for (let i = 0; i < iterations; i++) {
      // JSON.parse is the HTTP layer's; it is included so the figure is per request as received.
      try {
        prepareCompletion(JSON.parse(c.body), ctx);
      } catch {
        /* rejections are part of the measurement */
      }
    }
    return Number(process.hrtime.bigint() - started) / 1e3 / iterations;
  };
  run(2000); // warm up
  const micros = run(20_000);
  process.stdout.write(`${c.name.padEnd(40)} ${micros.toFixed(2).padStart(8)} µs/request  ${Math.round(1e6 / micros).toLocaleString('en').padStart(10)} /s\n`);
}
registry.close();
