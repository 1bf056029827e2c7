import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadTokenizer } from '../../src/tokenizer/index.ts';
import { mergeSymbols } from '../../src/tokenizer/hf.ts';

const dir = mkdtempSync(join(tmpdir(), 'tok-'));

/** GPT-2's byte alphabet, spelled out the way tokenizer.json vocabularies use it. */
function byteAlphabet(): string[] {
  const bs: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = [...bs];
  let n = 0;
  for (let b = 0; b < 256; b++) if (!bs.includes(b)) (bs.push(b), cs.push(256 + n++));
  const out: string[] = new Array(256);
  bs.forEach((b, i) => (out[b] = String.fromCharCode(cs[i])));
  return out;
}

function writeTokenizerJson(name: string, style: 'gpt2' | 'llama3'): string {
  const vocab: Record<string, number> = {};
  byteAlphabet().forEach((c, i) => (vocab[c] = i));
  const merges = [['Ġ', 't'], ['h', 'e'], ['Ġt', 'he'], ['c', 'a'], ['ca', 't'], ['Ġ', 'cat']];
  for (const [a, b] of merges) vocab[a + b] ??= Object.keys(vocab).length;
  const n = Object.keys(vocab).length;
  const added =
    style === 'gpt2'
      ? [{ id: n, content: '<|endoftext|>', single_word: false, lstrip: false, rstrip: false, normalized: true, special: true }]
      : [
          { id: n, content: '<|begin_of_text|>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
          { id: n + 1, content: '<|end_of_text|>', single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
        ];
  const json =
    style === 'gpt2'
      ? {
          version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
          pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
          post_processor: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
          decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
          model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, vocab, merges: merges.map(([a, b]) => `${a} ${b}`) },
        }
      : {
          version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
          pre_tokenizer: {
            type: 'Sequence',
            pretokenizers: [
              { type: 'Split', pattern: { Regex: "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" }, behavior: 'Isolated', invert: false },
              { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: false },
            ],
          },
          post_processor: {
            type: 'Sequence',
            processors: [
              { type: 'ByteLevel', add_prefix_space: true, trim_offsets: false, use_regex: true },
              {
                type: 'TemplateProcessing',
                single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
                pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }, { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
                special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [n], tokens: ['<|begin_of_text|>'] } },
              },
            ],
          },
          decoder: { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true },
          model: { type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: false, byte_fallback: false, ignore_merges: true, vocab, merges },
        };
  const path = join(dir, `${name}.json`);
  writeFileSync(path, JSON.stringify(json));
  return path;
}

test('byte: BOS with add_special_tokens, verbatim without, round trip', async () => {
  const tok = await loadTokenizer({ kind: 'byte' });
  assert.is(tok.vocabSize, 258);
  assert.equal(tok.encode('', true), [tok.bosId]);
  assert.equal(tok.encode('', false), []);
  assert.equal(tok.encode('hé', false), [104, 0xc3, 0xa9]);
  assert.equal(tok.encode('hé', true), [256, 104, 0xc3, 0xa9]);
  assert.is(tok.decode(tok.encode('hé <|eos|> ✓', true), true), 'hé <|eos|> ✓');
  assert.is(tok.tokenString(0xc3), '\uFFFD');
  assert.is(tok.tokenString(65), 'A');
  assert.is(tok.tokenString(tok.eosId), '<|eos|>');
  // A leading U+FEFF is text, not a byte-order mark for the decoder to drop.
  assert.is(tok.decode(tok.encode('\ufeffx', false)), '\ufeffx');
  const d = tok.newStreamDecoder();
  assert.is(tok.encode('\ufeffx', false).map((id) => d.push(id)).join('') + d.flush(), '\ufeffx');
});

test('stream decoder holds back an incomplete UTF-8 sequence and skips special tokens', async () => {
  const tok = await loadTokenizer({ kind: 'byte' });
  const d = tok.newStreamDecoder();
  assert.is(d.push(104), 'h');
  assert.is(d.push(0xe2), '');
  assert.is(d.push(0x9c), '');
  assert.is(d.push(0x93), '✓');
  assert.is(d.push(tok.eosId), '');
  assert.is(d.push(0xc3), '');
  assert.is(d.flush(), '\uFFFD');
  const raw = tok.newStreamDecoder({ skipSpecialTokens: false });
  assert.is(raw.push(tok.bosId), '<|bos|>');
});

test('r50k_base: GPT-2 ids, <|endoftext|> as BOS/EOS, round trip', async () => {
  const tok = await loadTokenizer({ kind: 'r50k_base' });
  assert.is(tok.vocabSize, 50257);
  assert.is(tok.bosId, 50256);
  assert.is(tok.eosId, 50256);
  assert.equal(tok.encode('Hello world', false), [15496, 995]);
  assert.equal(tok.encode('Hello world', true), [50256, 15496, 995]);
  assert.equal(tok.encode('', true), [50256]);
  assert.equal(tok.encode('a<|endoftext|>', false), [64, 50256]);
  const text = 'Ünïcödé 🙂 text\n  with spaces';
  assert.is(tok.decode(tok.encode(text, false)), text);
  assert.is(tok.tokenString(995), ' world');
  assert.is(tok.tokenPiece(995), 'Ġworld');
  const d = tok.newStreamDecoder();
  let out = '';
  for (const id of tok.encode(text, true)) out += d.push(id);
  out += d.flush();
  assert.is(out, text);
});

test('hf tokenizer.json (GPT-2 style): byte-level BPE with merges; add_special_tokens adds nothing', async () => {
  const path = writeTokenizerJson('gpt2', 'gpt2');
  const tok = await loadTokenizer({ kind: 'hf', path });
  const vocab = JSON.parse((await import('node:fs')).readFileSync(path, 'utf8')).model.vocab;
  assert.equal(tok.encode(' the cat', false), [vocab['Ġthe'], vocab['Ġcat']]);
  assert.equal(tok.encode(' the cat', true), [vocab['Ġthe'], vocab['Ġcat']]);
  assert.equal(tok.encode('cat<|endoftext|>', false), [vocab['cat'], tok.eosId]);
  assert.is(tok.tokenPiece(vocab['Ġthe']), 'Ġthe');
  assert.is(tok.tokenString(vocab['Ġthe']), ' the');
  const text = "it's the cat's 12345 ✓\n\n  end";
  assert.is(tok.decode(tok.encode(text, false)), text);
  assert.is(tok.decode(tok.encode('x<|endoftext|>', false), true), 'x');
});

test('hf tokenizer.json (Llama-3 style): Split regex with (?i:...), TemplateProcessing BOS', async () => {
  const path = writeTokenizerJson('llama3', 'llama3');
  const tok = await loadTokenizer({ kind: 'hf', path });
  const vocab = JSON.parse((await import('node:fs')).readFileSync(path, 'utf8')).model.vocab;
  assert.is(tok.decode([tok.bosId]), '<|begin_of_text|>');
  assert.is(tok.decode([tok.eosId]), '<|end_of_text|>');
  assert.equal(tok.encode('', true), [tok.bosId]);
  assert.equal(tok.encode(' the', true), [tok.bosId, vocab['Ġthe']]);
  // "'S" is one pre-token through the case-insensitive group: two byte tokens, not split differently.
  assert.equal(tok.encode("'S", false), [vocab["'"], vocab['S']]);
  const text = "IT'S the Cat 1234567 ✓!!\r\n end";
  assert.is(tok.decode(tok.encode(text, false)), text);
});

test('hf directory: tokenizer.json + tokenizer_config.json name BOS/EOS; unsupported components fail at load', async () => {
  const { mkdirSync, copyFileSync } = await import('node:fs');
  const sub = join(dir, 'model-dir');
  mkdirSync(sub);
  copyFileSync(writeTokenizerJson('gpt2-dir', 'gpt2'), join(sub, 'tokenizer.json'));
  writeFileSync(join(sub, 'tokenizer_config.json'), JSON.stringify({ bos_token: { content: '<|endoftext|>' }, eos_token: '<|endoftext|>' }));
  const tok = await loadTokenizer({ kind: 'hf', path: sub });
  assert.is(tok.decode([tok.eosId]), '<|endoftext|>');
  assert.is(tok.bosId, tok.eosId);
  const bad = join(dir, 'bad.json');
  writeFileSync(bad, JSON.stringify({ model: { type: 'Unigram', vocab: [] }, decoder: { type: 'Metaspace' } }));
  try {
    await loadTokenizer({ kind: 'hf', path: bad });
    assert.unreachable('should fail');
  } catch (err) {
    assert.match((err as Error).message, /not supported/);
  }
});

test('hf tokenizer.json (Llama-2 / Mistral style): ▁ spaces, byte fallback, BOS template, leading space stripped', async () => {
  const vocab: Record<string, number> = { '<unk>': 0, '<s>': 1, '</s>': 2 };
  for (let b = 0; b < 256; b++) vocab[`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`] = 3 + b;
  const merges = [['▁', 't'], ['h', 'e'], ['▁t', 'he'], ['c', 'a'], ['ca', 't'], ['▁', 'cat']];
  for (const c of ['▁', 't', 'h', 'e', 'c', 'a']) vocab[c] = Object.keys(vocab).length;
  for (const [a, b] of merges) vocab[a + b] ??= Object.keys(vocab).length;
  const added = [
    { id: 0, content: '<unk>', special: true },
    { id: 1, content: '<s>', special: true },
    { id: 2, content: '</s>', special: true },
  ];
  for (const [name, pre, normalizer] of [
    ['sp-legacy', null, { type: 'Sequence', normalizers: [{ type: 'Prepend', prepend: '▁' }, { type: 'Replace', pattern: { String: ' ' }, content: '▁' }] }],
    ['sp-metaspace', { type: 'Metaspace', replacement: '▁', prepend_scheme: 'first', split: false }, null],
  ] as const) {
    const json = {
      version: '1.0', added_tokens: added, normalizer, pre_tokenizer: pre,
      post_processor: { type: 'TemplateProcessing', single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }], pair: [], special_tokens: { '<s>': { id: '<s>', ids: [1], tokens: ['<s>'] } } },
      decoder: { type: 'Sequence', decoders: [{ type: 'Replace', pattern: { String: '▁' }, content: ' ' }, { type: 'ByteFallback' }, { type: 'Fuse' }, { type: 'Strip', content: ' ', start: 1, stop: 0 }] },
      model: { type: 'BPE', dropout: null, unk_token: '<unk>', continuing_subword_prefix: null, end_of_word_suffix: null, fuse_unk: true, byte_fallback: true, vocab, merges: merges.map(([a, b]) => `${a} ${b}`) },
    };
    const path = join(dir, `${name}.json`);
    writeFileSync(path, JSON.stringify(json));
    const tok = await loadTokenizer({ kind: 'hf', path });
    assert.is(tok.bosId, 1, name);
    assert.is(tok.eosId, 2, name);
    const ids = tok.encode('the cat ✓', true);
    assert.equal(ids, [1, vocab['▁the'], vocab['▁cat'], vocab['▁'], 3 + 0xe2, 3 + 0x9c, 3 + 0x93], name);
    assert.is(tok.decode(ids, true), 'the cat ✓', name);
    assert.is(tok.tokenString(vocab['▁cat']), 'cat', name);
    const d = tok.newStreamDecoder();
    assert.is(ids.slice(1).map((id) => d.push(id)).join(''), ' the cat ✓', name);
  }
});

test('BPE merges (short-word scan and long-word heap) match the one-pair-at-a-time reference', () => {
  // ['aa', 'a'] ranks before ['a', 'a'], as Gemma's runs of "▁" do: merging every "a a" at once would differ.
  const merges = [['aa', 'a'], ['a', 'b'], ['b', 'a'], ['ab', 'a'], ['a', 'a'], ['aa', 'b'], ['c', 'c'], ['ab', 'ab'], ['cc', 'a'], ['ba', 'c']];
  const ranks = new Map(merges.map(([a, b], i) => [`${a}\u0000${b}`, i]));
  const scan = (symbols: string[]) => {
    for (;;) {
      let best = Infinity;
      let at = -1;
      for (let i = 0; i < symbols.length - 1; i++) {
        const r = ranks.get(`${symbols[i]}\u0000${symbols[i + 1]}`);
        if (r !== undefined && r < best) (best = r), (at = i);
      }
      if (at < 0) return symbols;
      symbols.splice(at, 2, symbols[at] + symbols[at + 1]);
    }
  };
  let seed = 7;
  const rand = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff), seed / 0x7fffffff);
  for (let k = 0; k < 200; k++) {
    const word = Array.from({ length: 2 + Math.floor(rand() * 200) }, () => 'abc'[Math.floor(rand() * 3)]);
    assert.equal(mergeSymbols(word.slice(), ranks), scan(word.slice()));
  }
});

test('encode is cached and fast enough for the hot path', async () => {
  const tok = await loadTokenizer({ kind: 'r50k_base' });
  const again = await loadTokenizer({ kind: 'r50k_base' });
  assert.ok(tok === again);
});

test.after(() => rmSync(dir, { recursive: true, force: true }));
test.run();
