// Hugging Face `tokenizer.json` (fast-tokenizer format): BPE models, either byte-level (GPT-2, Llama-3, Qwen)
// or SentencePiece-style with "▁" spaces and <0xXX> byte fallback (Llama-2, Mistral). Unsupported components
// fail at load with a message naming them.
import { readFile, stat } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import type { Tokenizer } from './types.ts';
import { TokenTable, byteToUnicode, unicodeToByte } from './table.ts';
import { PairTable, mergeIds } from './merge.ts';

interface AddedToken {
  id: number;
  content: string;
  special?: boolean;
}

type Json = Record<string, any>; // eslint-disable-line @typescript-eslint/no-explicit-any

const GPT2_PATTERN = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
const PIECE_CACHE_LIMIT = 200_000;
/** Words of at least this many characters merge through the heap (fewer: the plain scan is faster). */
const LONG_WORD = 48;
const EOS_CANDIDATES = ['<|end_of_text|>', '<|endoftext|>', '</s>', '<eos>', '<|eot_id|>'];
const BOS_CANDIDATES = ['<|begin_of_text|>', '<s>', '<bos>', '<|startoftext|>'];

export async function loadHfTokenizer(path: string): Promise<Tokenizer> {
  const isDir = (await stat(path)).isDirectory();
  const file = isDir ? join(path, 'tokenizer.json') : path;
  const json = JSON.parse(await readFile(file, 'utf8')) as Json;
  let config: Json = {};
  try {
    config = JSON.parse(await readFile(join(isDir ? path : dirname(path), 'tokenizer_config.json'), 'utf8')) as Json;
  } catch {
    // tokenizer_config.json is optional: BOS/EOS then come from the post-processor and well-known names.
  }
  return buildHfTokenizer(json, config);
}

export function buildHfTokenizer(json: Json, config: Json = {}): Tokenizer {
  const model = json.model as Json;
  if (!model || (model.type !== undefined && model.type !== 'BPE')) throw new Error(`model type ${model?.type} is not supported (BPE only)`);
  const vocab = model.vocab as Record<string, number>;
  const added = ((json.added_tokens ?? []) as AddedToken[]).slice();

  const decoding = decoderStyle(json.decoder);

  // Token bytes: vocabulary entries spell bytes in GPT-2's alphabet; added tokens are their UTF-8 content.
  let maxId = -1;
  for (const id of Object.values(vocab)) maxId = Math.max(maxId, id);
  for (const t of added) maxId = Math.max(maxId, t.id);
  const encoder = new TextEncoder();
  const bytes: Uint8Array[] = new Array(maxId + 1);
  const pieces: string[] = new Array(maxId + 1);
  for (const [piece, id] of Object.entries(vocab)) {
    pieces[id] = piece;
    bytes[id] = decoding.byteLevel ? pieceBytes(piece, encoder) : spPieceBytes(piece, encoder);
  }
  const special = new Set<number>();
  for (const t of added) {
    pieces[t.id] = t.content;
    // The decoder renders added tokens too: SentencePiece-style ones spell spaces "▁" (Gemma's "▁▁" runs).
    bytes[t.id] = decoding.byteLevel ? encoder.encode(t.content) : spPieceBytes(t.content, encoder);
    if (t.special) special.add(t.id);
  }
  for (let i = 0; i <= maxId; i++) {
    bytes[i] ??= new Uint8Array(0);
    pieces[i] ??= '';
  }
  const table = new TokenTable(bytes, special, (id) => pieces[id] ?? '');

  const ranks = new Map<string, number>();
  (model.merges as (string | [string, string])[]).forEach((m, rank) => {
    const [a, b] = typeof m === 'string' ? splitMerge(m) : m;
    ranks.set(`${a}\u0000${b}`, rank);
  });
  const ignoreMerges = model.ignore_merges === true;
  const idMerges = idMergeTable(model.merges as (string | [string, string])[], vocab);
  const minUnitsPerToken = unitsPerTokenBound(json, vocab, ranks, added, decoding.byteLevel);
  const byteFallback = model.byte_fallback === true;
  const unkId = typeof model.unk_token === 'string' ? vocab[model.unk_token] : undefined;

  const normalize = buildNormalizer(json.normalizer);
  const preTokenize = buildPreTokenizer(json.pre_tokenizer);
  // SentencePiece decoders drop the space the encoder prepended to the first word.
  const strip = decoding.stripLeadingSpace ? (t: string) => (t.startsWith(' ') ? t.slice(1) : t) : (t: string) => t;
  const template = buildTemplate(json.post_processor);
  const addedSplit = buildAddedSplitter(added);

  const cache = new Map<string, number[]>();
  function bpe(word: string): number[] {
    const hit = cache.get(word);
    if (hit) return hit;
    let ids: number[];
    const direct = vocab[word];
    if (direct !== undefined && (ignoreMerges || word.length === 1)) {
      ids = [direct];
    } else {
      const chars = Array.from(word);
      ids = [];
      const unknown = (s: string) => {
        if (byteFallback) {
          for (const byte of encoder.encode(s)) {
            const fb = vocab[`<0x${byte.toString(16).toUpperCase().padStart(2, '0')}>`];
            if (fb !== undefined) ids.push(fb);
            else if (unkId !== undefined) ids.push(unkId);
          }
        } else if (unkId !== undefined) ids.push(unkId);
      };
      if (idMerges && chars.length >= LONG_WORD) {
        // A long word (a whole prompt, without a pre-tokenizer) merges over ids: no string is built per pair.
        const symbols = new Int32Array(chars.length);
        for (let i = 0; i < chars.length; i++) {
          const id = vocab[chars[i]];
          symbols[i] = typeof id === 'number' ? id : -1;
        }
        for (const at of mergeIds(symbols, idMerges.rank, idMerges.merged)) {
          if (symbols[at] >= 0) ids.push(symbols[at]);
          else unknown(chars[at]);
        }
      } else {
        for (const s of mergeSymbols(chars, ranks)) {
          const id = vocab[s];
          if (id !== undefined) ids.push(id);
          else unknown(s);
        }
      }
    }
    // Long "words" (a whole prompt when there is no pre-tokenizer) are not worth keeping.
    if (word.length <= 256) {
      if (cache.size >= PIECE_CACHE_LIMIT) cache.clear();
      cache.set(word, ids);
    }
    return ids;
  }

  const idOf = (name: unknown): number | undefined => {
    const content = typeof name === 'string' ? name : (name as Json | undefined)?.content;
    if (typeof content !== 'string') return undefined;
    return added.find((t) => t.content === content)?.id ?? vocab[content];
  };
  const findByName = (names: string[]) => names.map((n) => idOf(n)).find((id) => id !== undefined);
  const eosId = idOf(config.eos_token) ?? findByName(EOS_CANDIDATES) ?? -1;
  const bosId = idOf(config.bos_token) ?? template.prefix[0] ?? findByName(BOS_CANDIDATES) ?? eosId;

  return {
    kind: 'hf',
    vocabSize: maxId + 1,
    bosId,
    eosId,
    encode(text, addSpecialTokens) {
      const ids: number[] = [];
      if (addSpecialTokens) ids.push(...template.prefix);
      for (const seg of addedSplit(text)) {
        if (typeof seg === 'number') {
          ids.push(seg);
          continue;
        }
        for (const piece of preTokenize([normalize(seg)], ids.length === 0 || (addSpecialTokens && ids.length === template.prefix.length))) {
          if (piece.length === 0) continue;
          const out = bpe(piece);
          for (let i = 0; i < out.length; i++) ids.push(out[i]);
        }
      }
      if (addSpecialTokens) ids.push(...template.suffix);
      return ids;
    },
    minTokens: (text, addSpecialTokens) =>
      (addSpecialTokens ? template.prefix.length + template.suffix.length : 0) + (minUnitsPerToken === null ? 0 : Math.ceil(text.length / minUnitsPerToken)),
    minTokensExact: false,
    ...table.lookups(),
    decode: (ids, skip) => strip(table.decode(ids, skip)),
    tokenString: (id) => strip(table.tokenString(id)),
  };
}

/**
 * The most UTF-16 units of a prompt one token can stand for, or null when no such bound holds. It holds when no
 * step shortens the text (no Unicode normalization, no replacement by something shorter, no Split that removes)
 * and every symbol the merges leave becomes at least one id (an unknown token, byte fallback, or a byte-level
 * alphabet and merges all in the vocabulary): each id then covers at most the longest vocabulary entry, merge
 * result or added token (ByteLevel's alphabet spells a unit as one to four characters, never fewer).
 */
function unitsPerTokenBound(json: Json, vocab: Record<string, number>, ranks: Map<string, number>, added: AddedToken[], byteLevel: boolean): number | null {
  if (!keepsLength(json.normalizer) || !keepsLength(json.pre_tokenizer)) return null;
  const model = json.model as Json;
  const mergedPieces = [...ranks.keys()].map((k) => k.replace('\u0000', ''));
  const fallbacks = Array.from({ length: 256 }, (_, b) => `<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
  const covered =
    (typeof model.unk_token === 'string' && vocab[model.unk_token] !== undefined) ||
    (model.byte_fallback === true && fallbacks.every((f) => vocab[f] !== undefined)) ||
    (byteLevel && usesType(json.pre_tokenizer, 'ByteLevel') && byteToUnicode.every((c) => vocab[c] !== undefined) && mergedPieces.every((p) => vocab[p] !== undefined));
  if (!covered) return null;
  let most = 2; // a symbol is at least one code point
  for (const piece of Object.keys(vocab)) most = Math.max(most, piece.length);
  for (const piece of mergedPieces) most = Math.max(most, piece.length);
  for (const t of added) most = Math.max(most, t.content.length);
  return most;
}

/** True when a normalizer or pre-tokenizer never makes the text (the sum of its pieces) shorter. */
function keepsLength(node: Json | null | undefined): boolean {
  if (!node) return true;
  switch (node.type) {
    case 'Sequence':
      return ((node.normalizers ?? node.pretokenizers ?? []) as Json[]).every(keepsLength);
    case 'Prepend':
    case 'ByteLevel':
      return true;
    case 'Replace':
      return typeof node.pattern?.String === 'string' && String(node.content).length >= node.pattern.String.length;
    case 'Split':
      return node.behavior !== 'Removed' && !node.invert;
    case 'Metaspace':
      return ((node.replacement as string | undefined) ?? '\u2581').length >= 1;
    default:
      return false; // NFC, NFKC, ...: composition shortens
  }
}

/**
 * The merges over ids: pair (left id, right id) -> its rank, rank -> the id it makes. Null unless every merge's
 * parts and result are in the vocabulary (Hugging Face refuses a file where they are not), so that a symbol
 * outside it never merges and the ids say all the strings would.
 */
function idMergeTable(merges: (string | [string, string])[], vocab: Record<string, number>): { rank: (l: number, r: number) => number; merged: (rank: number) => number } | null {
  const triples: number[] = [];
  const result = new Int32Array(merges.length);
  for (let rank = 0; rank < merges.length; rank++) {
    const m = merges[rank];
    const [a, b] = typeof m === 'string' ? splitMerge(m) : m;
    const [left, right, joined] = [vocab[a], vocab[b], vocab[a + b]];
    if (typeof left !== 'number' || typeof right !== 'number' || typeof joined !== 'number') return null;
    triples.push(left, right, rank);
    result[rank] = joined;
  }
  const table = new PairTable(triples);
  return { rank: (l, r) => table.get(l, r), merged: (rank) => result[rank] };
}

function pieceBytes(piece: string, encoder: InstanceType<typeof TextEncoder>): Uint8Array {
  const out: number[] = [];
  for (const ch of piece) {
    const b = unicodeToByte.get(ch);
    if (b !== undefined) out.push(b);
    else out.push(...encoder.encode(ch));
  }
  return Uint8Array.from(out);
}

/**
 * Applies BPE merges one at a time, lowest rank first (leftmost among equals), like Hugging Face's tokenizers.
 * Short words use a plain scan; long ones (a whole prompt when there is no pre-tokenizer) a heap over a linked
 * list, O(n log n). Merging every occurrence of the best pair at once (GPT-2's Python loop) is not the same: when a
 * merge creates a pair ranked before the one being applied (Gemma's runs of "▁" do), that pair must go first.
 */
export function mergeSymbols(symbols: string[], ranks: Map<string, number>): string[] {
  if (symbols.length < LONG_WORD) {
    while (symbols.length > 1) {
      let best = Infinity;
      let at = -1;
      for (let i = 0; i < symbols.length - 1; i++) {
        const r = ranks.get(`${symbols[i]}\u0000${symbols[i + 1]}`);
        if (r !== undefined && r < best) {
          best = r;
          at = i;
        }
      }
      if (at < 0) break;
      symbols.splice(at, 2, symbols[at] + symbols[at + 1]);
    }
    return symbols;
  }
  const n = symbols.length;
  const next = new Int32Array(n);
  const prev = new Int32Array(n);
  for (let i = 0; i < n; i++) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  const heap: number[] = []; // keys: rank * 2^24 + left position
  const push = (key: number) => {
    heap.push(key);
    let i = heap.length - 1;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (heap[parent] <= heap[i]) break;
      [heap[parent], heap[i]] = [heap[i], heap[parent]];
      i = parent;
    }
  };
  const pop = (): number => {
    const top = heap[0];
    const last = heap.pop()!;
    if (heap.length > 0) {
      heap[0] = last;
      let i = 0;
      for (;;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < heap.length && heap[l] < heap[m]) m = l;
        if (r < heap.length && heap[r] < heap[m]) m = r;
        if (m === i) break;
        [heap[m], heap[i]] = [heap[i], heap[m]];
        i = m;
      }
    }
    return top;
  };
  const SHIFT = 16777216;
  const consider = (left: number) => {
    const right = next[left];
    if (left < 0 || right < 0) return;
    const r = ranks.get(`${symbols[left]}\u0000${symbols[right]}`);
    if (r !== undefined) push(r * SHIFT + left);
  };
  for (let i = 0; i < n - 1; i++) consider(i);
  while (heap.length > 0) {
    const key = pop();
    const left = key % SHIFT;
    const rank = Math.floor(key / SHIFT);
    const right = next[left];
    if (right < 0 || symbols[left] === '') continue;
    if (ranks.get(`${symbols[left]}\u0000${symbols[right]}`) !== rank) continue; // stale entry
    symbols[left] += symbols[right];
    symbols[right] = '';
    next[left] = next[right];
    if (next[right] >= 0) prev[next[right]] = left;
    consider(prev[left]);
    consider(left);
  }
  const out: string[] = [];
  for (let i = 0; i >= 0; i = next[i]) out.push(symbols[i]);
  return out;
}

/** SentencePiece-style piece: "▁" is a space, "<0xAB>" is the byte 0xAB. */
function spPieceBytes(piece: string, encoder: InstanceType<typeof TextEncoder>): Uint8Array {
  const m = /^<0x([0-9A-Fa-f]{2})>$/.exec(piece);
  if (m) return Uint8Array.of(parseInt(m[1], 16));
  return encoder.encode(piece.replaceAll('\u2581', ' '));
}

function decoderStyle(node: Json | null | undefined): { byteLevel: boolean; stripLeadingSpace: boolean } {
  if (usesType(node, 'ByteLevel')) return { byteLevel: true, stripLeadingSpace: false };
  const parts: Json[] = node?.type === 'Sequence' ? (node.decoders as Json[]) : node ? [node] : [];
  let ok = parts.length > 0;
  let stripLeadingSpace = false;
  for (const d of parts) {
    if (d.type === 'Metaspace') stripLeadingSpace = d.prepend_scheme !== 'never' && d.add_prefix_space !== false;
    else if (d.type === 'Strip') stripLeadingSpace = (d.start ?? 0) > 0;
    else if (d.type === 'Replace') ok &&= d.pattern?.String === '\u2581' && d.content === ' ';
    else if (d.type !== 'ByteFallback' && d.type !== 'Fuse') ok = false;
  }
  if (!ok) throw new Error(`decoder ${describe(node)} is not supported (ByteLevel, or Metaspace/Replace+ByteFallback+Fuse+Strip)`);
  return { byteLevel: false, stripLeadingSpace };
}

function splitMerge(m: string): [string, string] {
  const i = m.indexOf(' ', 1);
  return [m.slice(0, i), m.slice(i + 1)];
}

function usesType(node: Json | null | undefined, type: string): boolean {
  if (!node) return false;
  if (node.type === type) return true;
  if (node.type === 'Sequence') return ((node.decoders ?? node.pretokenizers ?? node.normalizers ?? node.processors ?? []) as Json[]).some((n) => usesType(n, type));
  return false;
}

function describe(node: Json | null | undefined): string {
  return node ? String(node.type) : 'null';
}

/**
 * Added tokens are matched first, leftmost-longest (as Hugging Face's Aho-Corasick matcher does), and never go
 * through the model. A trie over UTF-16 code units: one regex alternation of Gemma 3's 6,415 added tokens made
 * a 12-token prompt cost ~115 µs (Hugging Face's tokenizers.js: 6 µs), the trie ~2 µs.
 */
function buildAddedSplitter(added: AddedToken[]): (text: string) => (string | number)[] {
  if (added.length === 0) return (text) => [text];
  interface Node {
    next: Map<number, Node>;
    id: number; // -1 when no token ends here
  }
  const root: Node = { next: new Map(), id: -1 };
  for (const t of added) {
    if (t.content.length === 0) continue;
    let node = root;
    for (let i = 0; i < t.content.length; i++) {
      const c = t.content.charCodeAt(i);
      let child = node.next.get(c);
      if (!child) node.next.set(c, (child = { next: new Map(), id: -1 }));
      node = child;
    }
    node.id = t.id; // a later token of equal content wins, as in a Map over contents
  }
  return (text) => {
    const out: (string | number)[] = [];
    let last = 0;
    for (let i = 0; i < text.length; ) {
      let node = root.next.get(text.charCodeAt(i));
      if (!node) {
        i++;
        continue;
      }
      let id = -1;
      let end = i;
      for (let j = i + 1; ; j++) {
        if (node.id >= 0) (id = node.id), (end = j);
        if (j >= text.length) break;
        const child: Node | undefined = node.next.get(text.charCodeAt(j));
        if (!child) break;
        node = child;
      }
      if (id < 0) {
        i++;
        continue;
      }
      if (i > last) out.push(text.slice(last, i));
      out.push(id);
      last = i = end;
    }
    if (last < text.length) out.push(text.slice(last));
    return out;
  };
}

function buildNormalizer(node: Json | null | undefined): (s: string) => string {
  if (!node) return (s) => s;
  switch (node.type) {
    case 'NFC':
    case 'NFD':
    case 'NFKC':
    case 'NFKD':
      return (s) => s.normalize(node.type);
    case 'Prepend':
      return (s) => (s.length ? node.prepend + s : s);
    case 'Replace': {
      const re = patternRegExp(node.pattern);
      return (s) => s.replace(re, node.content);
    }
    case 'Sequence': {
      const parts = (node.normalizers as Json[]).map(buildNormalizer);
      return (s) => parts.reduce((acc, f) => f(acc), s);
    }
    default:
      throw new Error(`normalizer ${describe(node)} is not supported`);
  }
}

/** `first` is true for the text at the start of the input (Metaspace's prepend_scheme "first"). */
type PreTokenizer = (pieces: string[], first: boolean) => string[];

function buildPreTokenizer(node: Json | null | undefined): PreTokenizer {
  if (!node) return (p) => p;
  switch (node.type) {
    case 'ByteLevel': {
      const re = node.use_regex === false ? null : new RegExp(toJsRegex(GPT2_PATTERN), 'gu');
      const prefix = node.add_prefix_space === true;
      const encoder = new TextEncoder();
      return (pieces) =>
        pieces.flatMap((p) => {
          const text = prefix && !p.startsWith(' ') ? ` ${p}` : p;
          const parts = re ? splitIsolated(text, re) : [text];
          return parts.map((part) => {
            const raw = encoder.encode(part);
            let s = '';
            for (let i = 0; i < raw.length; i++) s += byteToUnicode[raw[i]];
            return s;
          });
        });
    }
    case 'Split': {
      if (node.invert) throw new Error('pre_tokenizer Split with invert is not supported');
      const re = patternRegExp(node.pattern);
      const behavior = node.behavior as string;
      return (pieces) => pieces.flatMap((p) => splitWith(p, re, behavior));
    }
    case 'Sequence': {
      const parts = (node.pretokenizers as Json[]).map(buildPreTokenizer);
      return (pieces, first) => parts.reduce((acc, f) => f(acc, first), pieces);
    }
    case 'Metaspace': {
      const mark = (node.replacement as string | undefined) ?? '\u2581';
      const scheme = (node.prepend_scheme as string | undefined) ?? (node.add_prefix_space === false ? 'never' : 'always');
      const split = node.split !== false;
      return (pieces, first) =>
        pieces.flatMap((p, i) => {
          let s = p.replaceAll(' ', mark);
          if ((scheme === 'always' || (scheme === 'first' && first && i === 0)) && !s.startsWith(mark)) s = mark + s;
          if (!split) return [s];
          return s.split(new RegExp(`(?=${escapeRegExp(mark)})`)).filter((x) => x.length > 0);
        });
    }
    default:
      throw new Error(`pre_tokenizer ${describe(node)} is not supported`);
  }
}

function splitIsolated(text: string, re: RegExp): string[] {
  return splitWith(text, re, 'Isolated');
}

function splitWith(text: string, re: RegExp, behavior: string): string[] {
  const out: string[] = [];
  let last = 0;
  let pendingMatch: string | null = null; // for MergedWithNext
  const push = (s: string) => {
    if (s.length) out.push(s);
  };
  for (const m of text.matchAll(re)) {
    if (m[0].length === 0) continue;
    const gap = text.slice(last, m.index);
    switch (behavior) {
      case 'Isolated':
        push(gap);
        push(m[0]);
        break;
      case 'Removed':
        push(gap);
        break;
      case 'MergedWithPrevious':
        push(gap + m[0]);
        break;
      case 'MergedWithNext':
        if (pendingMatch !== null) push(pendingMatch + gap);
        else push(gap);
        pendingMatch = m[0];
        break;
      case 'Contiguous':
        push(gap);
        if (out.length && last === m.index && out[out.length - 1] !== gap) out[out.length - 1] += m[0];
        else push(m[0]);
        break;
      default:
        throw new Error(`Split behavior ${behavior} is not supported`);
    }
    last = m.index + m[0].length;
  }
  const tail = text.slice(last);
  if (pendingMatch !== null) push(pendingMatch + tail);
  else push(tail);
  return out;
}

function patternRegExp(pattern: Json): RegExp {
  if (typeof pattern?.String === 'string') return new RegExp(escapeRegExp(pattern.String), 'g');
  if (typeof pattern?.Regex === 'string') return new RegExp(toJsRegex(pattern.Regex), 'gu');
  throw new Error('pattern must be {String} or {Regex}');
}

/**
 * Rust/Oniguruma -> JS: Node 20 lacks inline modifier groups, so `(?i:...)` becomes explicit case classes; and
 * Oniguruma's `\s` is Unicode White_Space (JS's `\s` adds U+FEFF and misses U+0085), its `\d` any decimal digit.
 */
export function toJsRegex(source: string): string {
  let out = '';
  let i = 0;
  while (i < source.length) {
    if (source.startsWith('(?i:', i)) {
      let depth = 1;
      let j = i + 4;
      let body = '';
      while (j < source.length && depth > 0) {
        const ch = source[j];
        if (ch === '\\') {
          body += source.slice(j, j + 2);
          j += 2;
          continue;
        }
        if (ch === '(') depth++;
        if (ch === ')') depth--;
        if (depth > 0) body += ch;
        j++;
      }
      out += `(?:${caseless(body)})`;
      i = j;
      continue;
    }
    if (source[i] === '\\') {
      out += CLASS_ESCAPES[source[i + 1]] ?? source.slice(i, i + 2);
      i += 2;
      continue;
    }
    out += source[i++];
  }
  return out;
}

const CLASS_ESCAPES: Record<string, string> = {
  s: '\\p{White_Space}',
  S: '\\P{White_Space}',
  d: '\\p{Nd}',
  D: '\\P{Nd}',
};

function caseless(body: string): string {
  let out = '';
  let inClass = false;
  for (let i = 0; i < body.length; i++) {
    const ch = body[i];
    if (ch === '\\') {
      out += CLASS_ESCAPES[body[i + 1]] ?? body.slice(i, i + 2);
      i++;
      continue;
    }
    if (ch === '[') inClass = true;
    else if (ch === ']') inClass = false;
    const lower = ch.toLowerCase();
    const upper = ch.toUpperCase();
    if (lower !== upper) out += inClass ? lower + upper : `[${lower}${upper}]`;
    else out += ch;
  }
  return out;
}

interface Template {
  prefix: number[];
  suffix: number[];
}

/** What `add_special_tokens` adds: the post-processor's single-sequence template (BOS for Llama-3; nothing for GPT-2). */
function buildTemplate(node: Json | null | undefined): Template {
  const none = { prefix: [], suffix: [] };
  if (!node) return none;
  switch (node.type) {
    case 'ByteLevel':
      return none;
    case 'TemplateProcessing': {
      const t: Template = { prefix: [], suffix: [] };
      let seen = false;
      for (const item of node.single as Json[]) {
        if (item.Sequence) {
          seen = true;
          continue;
        }
        const ids = node.special_tokens?.[item.SpecialToken?.id]?.ids as number[] | undefined;
        if (!ids) throw new Error(`post_processor special token ${item.SpecialToken?.id} is undefined`);
        (seen ? t.suffix : t.prefix).push(...ids);
      }
      return t;
    }
    case 'Sequence': {
      const parts = (node.processors as Json[]).map(buildTemplate);
      return { prefix: parts.flatMap((p) => p.prefix), suffix: parts.flatMap((p) => p.suffix) };
    }
    default:
      throw new Error(`post_processor ${describe(node)} is not supported`);
  }
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}
