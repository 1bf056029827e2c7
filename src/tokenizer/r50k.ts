// GPT-2's r50k_base BPE (50257 ids) from gpt-tokenizer's offline rank table; <|endoftext|> is BOS and EOS.
// The encoder is tiktoken's (and gpt-tokenizer's): GPT-2's split pattern, a whole piece that is a token is that
// token, otherwise the adjacent pair whose bytes form the lowest-ranked token merges first, leftmost among equals.
// Long pieces (a run of one letter is a single piece) merge with a heap over a linked list, O(n log n); the scan
// gpt-tokenizer uses is O(n²), minutes for a few megabytes of "a".
import type { Tokenizer } from './types.ts';
import { TokenTable, bytesToPiece } from './table.ts';

const ENDOFTEXT = '<|endoftext|>';
const ENDOFTEXT_ID = 50256;
/** GPT-2's pre-tokenizer: gpt-tokenizer's R50K_TOKEN_SPLIT_REGEX. */
const SPLIT = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
/** Pieces of at most this many bytes merge by scanning; longer ones through the heap. */
const SCAN_BELOW = 64;
const CACHE_PIECES_UP_TO = 256;
const CACHE_LIMIT = 100_000;
/** A symbol's pair rank when it and its right neighbour make no token. */
const NONE = 0x7fffffff;

export async function loadR50kTokenizer(): Promise<Tokenizer> {
  const { default: ranks } = await import('gpt-tokenizer/bpeRanks/r50k_base');
  const encoder = new TextEncoder();
  const bytes: Uint8Array[] = new Array(ENDOFTEXT_ID + 1);
  (ranks as (string | number[])[]).forEach((v, id) => {
    bytes[id] = typeof v === 'string' ? encoder.encode(v) : Uint8Array.from(v);
  });
  bytes[ENDOFTEXT_ID] = encoder.encode(ENDOFTEXT);
  for (let i = 0; i < bytes.length; i++) bytes[i] ??= new Uint8Array(0);
  const table = new TokenTable(bytes, new Set([ENDOFTEXT_ID]), (id) =>
    id === ENDOFTEXT_ID ? ENDOFTEXT : bytesToPiece(bytes[id]),
  );
  const bpe = new ByteLevelBpe(bytes.slice(0, ENDOFTEXT_ID));
  let maxTokenBytes = 0;
  for (const b of bytes) maxTokenBytes = Math.max(maxTokenBytes, b.length);

  // Like a Hugging Face GPT-2 tokenizer, <|endoftext|> in a prompt's text becomes the special token.
  const encodeText = (text: string, ids: number[]): void => {
    let at = 0;
    for (let end = text.indexOf(ENDOFTEXT); end >= 0; end = text.indexOf(ENDOFTEXT, at)) {
      if (end > at) bpe.encode(text.slice(at, end), ids);
      ids.push(ENDOFTEXT_ID);
      at = end + ENDOFTEXT.length;
    }
    if (at < text.length) bpe.encode(at === 0 ? text : text.slice(at), ids);
  };
  return {
    kind: 'r50k_base',
    vocabSize: ENDOFTEXT_ID + 1,
    bosId: ENDOFTEXT_ID,
    eosId: ENDOFTEXT_ID,
    encode(text, addSpecialTokens) {
      const ids: number[] = addSpecialTokens ? [ENDOFTEXT_ID] : [];
      encodeText(text, ids);
      return ids;
    },
    // Every token spells at most maxTokenBytes of the text's UTF-8 (lone surrogates are U+FFFD's 3 bytes in both).
    minTokens: (text, addSpecialTokens) => Math.ceil(Buffer.byteLength(text, 'utf8') / maxTokenBytes) + (addSpecialTokens ? 1 : 0),
    minTokensExact: false,
    ...table.lookups(),
  };
}

/**
 * tiktoken's byte-pair encoding over a rank table (a token's id is its rank). Every symbol is a token at every
 * step (single bytes are, and a merge forms one), so the rank of joining two symbols is looked up by their ids.
 */
class ByteLevelBpe {
  /** A token's bytes as a latin1 string -> its id. */
  readonly #id = new Map<string, number>();
  /** (left id, right id) -> the id of the token their bytes make together. */
  readonly #joined: PairTable;
  readonly #byteId = new Int32Array(256).fill(-1);
  readonly #cache = new Map<string, number[]>();

  constructor(tokens: Uint8Array[]) {
    const keys = tokens.map((b) => Buffer.from(b.buffer, b.byteOffset, b.length).toString('latin1'));
    keys.forEach((key, id) => {
      if (key.length > 0) this.#id.set(key, id);
      if (key.length === 1) this.#byteId[key.charCodeAt(0)] = id;
    });
    if (tokens.length > 65536 || this.#byteId.includes(-1)) throw new Error('a byte-level BPE needs every byte as a token and at most 65536 tokens');
    const pairs: number[] = [];
    keys.forEach((key, id) => {
      for (let k = 1; k < key.length; k++) {
        const left = this.#id.get(key.slice(0, k));
        const right = this.#id.get(key.slice(k));
        if (left !== undefined && right !== undefined) pairs.push(left, right, id);
      }
    });
    this.#joined = new PairTable(pairs);
  }

  /** Appends the ids of `text` (no special tokens) to `out`. */
  encode(text: string, out: number[]): void {
    for (const [piece] of text.matchAll(SPLIT)) {
      const hit = this.#cache.get(piece);
      if (hit) {
        for (let i = 0; i < hit.length; i++) out.push(hit[i]);
        continue;
      }
      // Lone surrogates become U+FFFD's bytes, as TextEncoder makes them.
      const key = isAscii(piece) ? piece : Buffer.from(piece, 'utf8').toString('latin1');
      const direct = this.#id.get(key);
      const ids = direct !== undefined ? [direct] : key.length < SCAN_BELOW ? this.#scan(key) : this.#heap(key);
      for (let i = 0; i < ids.length; i++) out.push(ids[i]);
      if (piece.length <= CACHE_PIECES_UP_TO) {
        if (this.#cache.size >= CACHE_LIMIT) this.#cache.clear();
        this.#cache.set(piece, ids);
      }
    }
  }

  /** The rank (id) of the token two symbols make, or Infinity. */
  #join(left: number, right: number): number {
    const id = this.#joined.get(left, right);
    return id < 0 ? Infinity : id;
  }

  /** The plain loop, quadratic: for short pieces it beats the heap. */
  #scan(key: string): number[] {
    const ids: number[] = [];
    for (let i = 0; i < key.length; i++) ids.push(this.#byteId[key.charCodeAt(i)]);
    const ranks: number[] = [];
    for (let i = 0; i + 1 < ids.length; i++) ranks.push(this.#join(ids[i], ids[i + 1]));
    while (ranks.length > 0) {
      let best = Infinity;
      let at = -1;
      for (let i = 0; i < ranks.length; i++) {
        if (ranks[i] < best) {
          best = ranks[i];
          at = i;
        }
      }
      if (at < 0) break;
      ids.splice(at, 2, best);
      ranks.splice(at, 1);
      if (at < ranks.length) ranks[at] = this.#join(ids[at], ids[at + 1]);
      if (at > 0) ranks[at - 1] = this.#join(ids[at - 1], ids[at]);
    }
    return ids;
  }

  /**
   * The same merges in O(n log n): a symbol is named by its first byte's position, `next` links the symbols left
   * to right, `pairRank[s]` is the rank of symbol s joined with its right neighbour (NONE: they make no token;
   * -1: s was merged into its left neighbour). A heap entry whose pair has changed since (its rank no longer
   * matches) is skipped when it comes up.
   */
  #heap(key: string): number[] {
    const n = key.length;
    const id = new Int32Array(n);
    const next = new Int32Array(n);
    const prev = new Int32Array(n);
    const pairRank = new Int32Array(n);
    const heap = new PairHeap(n);
    for (let i = 0; i < n; i++) id[i] = this.#byteId[key.charCodeAt(i)];
    for (let i = 0; i < n; i++) {
      next[i] = i + 1; // n: no right neighbour
      prev[i] = i - 1;
      const rank = i + 1 < n ? this.#joined.get(id[i], id[i + 1]) : -1;
      pairRank[i] = rank < 0 ? NONE : rank;
      if (rank >= 0) heap.push(rank, i);
    }
    while (heap.size > 0) {
      const rank = heap.topRank();
      const s = heap.pop();
      if (pairRank[s] !== rank) continue; // stale
      const right = next[s];
      id[s] = rank;
      next[s] = next[right];
      if (next[right] < n) prev[next[right]] = s;
      pairRank[right] = -1;
      for (let t = s, k = 0; k < 2 && t >= 0; k++, t = prev[s]) {
        const r = next[t] < n ? this.#joined.get(id[t], id[next[t]]) : -1;
        pairRank[t] = r < 0 ? NONE : r;
        if (r >= 0) heap.push(r, t);
      }
    }
    const ids: number[] = [];
    for (let s = 0; s < n; s = next[s]) ids.push(id[s]);
    return ids;
  }
}

/** An open-addressing hash table from two 16-bit ids to an id (a Map's keys above 2^31 are not small integers). */
class PairTable {
  readonly #keys: Uint32Array;
  readonly #values: Int32Array;
  readonly #mask: number;

  /** `triples`: left, right, id, left, right, id, ... */
  constructor(triples: number[]) {
    let capacity = 1024;
    while (capacity < (triples.length / 3) * 2) capacity *= 2;
    this.#keys = new Uint32Array(capacity);
    this.#values = new Int32Array(capacity).fill(-1);
    this.#mask = capacity - 1;
    for (let i = 0; i < triples.length; i += 3) {
      const key = ((triples[i] << 16) | triples[i + 1]) >>> 0;
      let slot = this.#slot(key);
      while (this.#values[slot] >= 0 && this.#keys[slot] !== key) slot = (slot + 1) & this.#mask;
      this.#keys[slot] = key;
      this.#values[slot] = triples[i + 2];
    }
  }

  #slot(key: number): number {
    return (Math.imul(key, 0x9e3779b1) >>> 7) & this.#mask;
  }

  /** The id, or -1. */
  get(left: number, right: number): number {
    const key = ((left << 16) | right) >>> 0;
    for (let slot = this.#slot(key); ; slot = (slot + 1) & this.#mask) {
      const value = this.#values[slot];
      if (value < 0 || this.#keys[slot] === key) return value;
    }
  }
}

/** A binary min-heap of (rank, position) pairs, ordered by rank, then position. */
class PairHeap {
  #ranks: Int32Array;
  #positions: Int32Array;
  size = 0;

  constructor(capacity: number) {
    this.#ranks = new Int32Array(Math.max(16, capacity));
    this.#positions = new Int32Array(Math.max(16, capacity));
  }

  push(rank: number, position: number): void {
    if (this.size === this.#ranks.length) {
      const ranks = new Int32Array(this.size * 2);
      const positions = new Int32Array(this.size * 2);
      ranks.set(this.#ranks);
      positions.set(this.#positions);
      this.#ranks = ranks;
      this.#positions = positions;
    }
    const r = this.#ranks;
    const p = this.#positions;
    let i = this.size++;
    while (i > 0) {
      const parent = (i - 1) >> 1;
      if (r[parent] < rank || (r[parent] === rank && p[parent] < position)) break;
      r[i] = r[parent];
      p[i] = p[parent];
      i = parent;
    }
    r[i] = rank;
    p[i] = position;
  }

  topRank(): number {
    return this.#ranks[0];
  }

  /** Removes the least pair; returns its position. */
  pop(): number {
    const r = this.#ranks;
    const p = this.#positions;
    const top = p[0];
    const size = --this.size;
    const rank = r[size];
    const position = p[size];
    let i = 0;
    for (;;) {
      let c = 2 * i + 1;
      if (c >= size) break;
      if (c + 1 < size && (r[c + 1] < r[c] || (r[c + 1] === r[c] && p[c + 1] < p[c]))) c++;
      if (r[c] > rank || (r[c] === rank && p[c] > position)) break;
      r[i] = r[c];
      p[i] = p[c];
      i = c;
    }
    r[i] = rank;
    p[i] = position;
    return top;
  }
}

function isAscii(s: string): boolean {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 0x7f) return false;
  return true;
}
