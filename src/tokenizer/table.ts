import type { StreamDecoder, Tokenizer } from './types.ts';
// Shared machinery of every tokenizer: each token id maps to a byte string; decoding concatenates bytes.

// ignoreBOM: a U+FEFF at the start of a text is a character of the text, not a byte-order mark to drop.
const utf8 = new TextDecoder('utf-8', { ignoreBOM: true });

/** One token's bytes, its vLLM-style decoded string, and whether it is a special (control) token. */
export class TokenTable {
  readonly bytes: Uint8Array[];
  readonly special: Uint8Array;
  #strings: (string | undefined)[];
  #pieces: (string | undefined)[];
  readonly #pieceOf: (id: number) => string;

  constructor(bytes: Uint8Array[], special: Set<number>, pieceOf: (id: number) => string) {
    this.bytes = bytes;
    this.special = new Uint8Array(bytes.length);
    for (const id of special) this.special[id] = 1;
    this.#strings = new Array(bytes.length);
    this.#pieces = new Array(bytes.length);
    this.#pieceOf = pieceOf;
  }

  get size(): number {
    return this.bytes.length;
  }

  /** `tokenizer.decode([id])`: invalid or partial UTF-8 shows as U+FFFD, as vLLM's logprob tokens do. */
  tokenString(id: number): string {
    let s = this.#strings[id];
    if (s === undefined) {
      const b = this.bytes[id];
      s = b ? utf8.decode(b) : '';
      this.#strings[id] = s;
    }
    return s;
  }

  /** `convert_ids_to_tokens`: the vocabulary entry as the tokenizer spells it (e.g. "Ġthe"). */
  tokenPiece(id: number): string {
    let s = this.#pieces[id];
    if (s === undefined) {
      s = this.#pieceOf(id);
      this.#pieces[id] = s;
    }
    return s;
  }

  decode(ids: ArrayLike<number>, skipSpecialTokens = false): string {
    let total = 0;
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i];
      if (skipSpecialTokens && this.special[id]) continue;
      total += this.bytes[id]?.length ?? 0;
    }
    const out = new Uint8Array(total);
    let at = 0;
    for (let i = 0; i < ids.length; i++) {
      const id = ids[i];
      if (skipSpecialTokens && this.special[id]) continue;
      const b = this.bytes[id];
      if (!b) continue;
      out.set(b, at);
      at += b.length;
    }
    return utf8.decode(out);
  }

  /** The Tokenizer methods every vocabulary answers from its table alike. */
  lookups(): Pick<Tokenizer, 'decode' | 'tokenString' | 'tokenPiece' | 'tokenBytes' | 'isSpecial' | 'newStreamDecoder'> {
    return {
      decode: (ids, skip) => this.decode(ids, skip),
      tokenString: (id) => this.tokenString(id),
      tokenPiece: (id) => this.tokenPiece(id),
      tokenBytes: (id) => this.bytes[id] ?? new Uint8Array(0),
      isSpecial: (id) => this.special[id] === 1,
      newStreamDecoder: (opts) => this.newStreamDecoder(opts?.skipSpecialTokens ?? true),
    };
  }

  newStreamDecoder(skipSpecialTokens = false): StreamDecoder {
    const decoder = new TextDecoder('utf-8', { ignoreBOM: true });
    return {
      push: (id: number) => {
        if (skipSpecialTokens && this.special[id]) return '';
        const b = this.bytes[id];
        return b ? decoder.decode(b, { stream: true }) : '';
      },
      flush: () => decoder.decode(),
    };
  }
}

/** GPT-2's reversible byte -> printable-character alphabet used by byte-level BPE vocabularies. */
export const byteToUnicode: string[] = (() => {
  const bs: number[] = [];
  for (let b = 0x21; b <= 0x7e; b++) bs.push(b);
  for (let b = 0xa1; b <= 0xac; b++) bs.push(b);
  for (let b = 0xae; b <= 0xff; b++) bs.push(b);
  const cs = [...bs];
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n);
      n++;
    }
  }
  const table: string[] = new Array(256);
  bs.forEach((b, i) => (table[b] = String.fromCharCode(cs[i])));
  return table;
})();

export const unicodeToByte: Map<string, number> = new Map(byteToUnicode.map((c, b) => [c, b]));

export function bytesToPiece(bytes: Uint8Array): string {
  let s = '';
  for (let i = 0; i < bytes.length; i++) s += byteToUnicode[bytes[i]];
  return s;
}
