// The tokenizer folder's shared types: the face (index.ts) and every implementation import them from here, so the
// face that picks an implementation never forms an import loop with it.
import type { TokenizerSpec } from '../config/index.ts';

export type { TokenizerSpec } from '../config/index.ts';

export interface Tokenizer {
  readonly kind: TokenizerSpec['kind'];
  /** Number of token ids (max id + 1). */
  readonly vocabSize: number;
  readonly bosId: number;
  readonly eosId: number;
  /** `addSpecialTokens` adds what the tokenizer adds (BOS for byte and r50k_base); false encodes verbatim. */
  encode(text: string, addSpecialTokens: boolean): number[];
  /**
   * A lower bound on `encode(text, addSpecialTokens).length` that costs no tokenization (O(1), or one native pass
   * over the text): what proves a prompt too long for a context before it is tokenized.
   */
  minTokens(text: string, addSpecialTokens: boolean): number;
  /** True when minTokens is the count itself (the byte tokenizer). */
  readonly minTokensExact: boolean;
  /** Like `tokenizer.decode(ids)`; special tokens are rendered unless `skipSpecialTokens`. */
  decode(ids: ArrayLike<number>, skipSpecialTokens?: boolean): string;
  /** `decoded_token` as vLLM shows it: `decode([id])`, partial UTF-8 as U+FFFD. */
  tokenString(id: number): string;
  /** The raw vocabulary entry (`convert_ids_to_tokens`), e.g. "Ġthe"; used for `/tokenize` token_strs. */
  tokenPiece(id: number): string;
  /** The bytes a token stands for. */
  tokenBytes(id: number): Uint8Array;
  isSpecial(id: number): boolean;
  /** Incremental detokenizer holding back incomplete UTF-8 like vLLM; generated text skips special tokens by default. */
  newStreamDecoder(opts?: { skipSpecialTokens?: boolean }): StreamDecoder;
}

/** Incremental detokenizer: holds back a trailing incomplete UTF-8 sequence until it completes. */
export interface StreamDecoder {
  /** Text released by this token (may be empty while a multi-byte character is incomplete). */
  push(id: number): string;
  /** Releases whatever is held back (an unfinished sequence becomes U+FFFD). */
  flush(): string;
}
