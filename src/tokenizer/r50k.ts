// GPT-2's r50k_base BPE (50257 ids) from gpt-tokenizer's offline rank table; <|endoftext|> is BOS and EOS.
// The encoder is tiktoken's (and gpt-tokenizer's): GPT-2's split pattern, a whole piece that is a token is that
// token, otherwise the adjacent pair whose bytes form the lowest-ranked token merges first, leftmost among equals.
// Long pieces (a run of one letter is a single piece) merge with a heap over a linked list (merge.ts), O(n log n);
// the scan gpt-tokenizer uses is O(n²), hours for a few megabytes of "a".
import type { Tokenizer } from './types.ts';
import { TokenTable, bytesToPiece } from './table.ts';
import { PairTable, mergeIds } from './merge.ts';

const ENDOFTEXT = '<|endoftext|>';
const ENDOFTEXT_ID = 50256;
/** GPT-2's pre-tokenizer: gpt-tokenizer's R50K_TOKEN_SPLIT_REGEX. */
const SPLIT = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
/** Pieces of at most this many bytes merge by scanning; longer ones through the heap. */
const SCAN_BELOW = 64;
const CACHE_PIECES_UP_TO = 256;
const CACHE_LIMIT = 100_000;

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

  /** The same merges in O(n log n) (merge.ts): a token's id is its rank. */
  #heap(key: string): number[] {
    const ids = new Int32Array(key.length);
    for (let i = 0; i < key.length; i++) ids[i] = this.#byteId[key.charCodeAt(i)];
    const starts = mergeIds(ids, (left, right) => this.#joined.get(left, right), (rank) => rank);
    return starts.map((s) => ids[s]);
  }
}

function isAscii(s: string): boolean {
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 0x7f) return false;
  return true;
}
