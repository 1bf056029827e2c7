// The tokenizer module shared by the gateway (prompt token counting) and the reference engine.
import type { TokenizerSpec } from '../config/index.ts';
import type { StreamDecoder } from './table.ts';
import { byteTokenizer } from './byte.ts';
import { loadR50kTokenizer } from './r50k.ts';
import { loadHfTokenizer } from './hf.ts';

export type { StreamDecoder } from './table.ts';
export type { TokenizerSpec } from '../config/index.ts';

export interface Tokenizer {
  readonly kind: TokenizerSpec['kind'];
  /** Number of token ids (max id + 1). */
  readonly vocabSize: number;
  readonly bosId: number;
  readonly eosId: number;
  /** `addSpecialTokens` adds what the tokenizer adds (BOS for byte and r50k_base); false encodes verbatim. */
  encode(text: string, addSpecialTokens: boolean): number[];
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

export class TokenizerLoadError extends Error {
  override name = 'TokenizerLoadError';
}

/** Loads a tokenizer; the result is cached per spec, so every caller shares one instance (and its caches). */
export function loadTokenizer(spec: TokenizerSpec): Promise<Tokenizer> {
  const key = spec.kind === 'hf' ? `hf:${spec.path}` : spec.kind;
  let loading = cache.get(key);
  if (!loading) {
    loading = load(spec);
    cache.set(key, loading);
    loading.catch(() => cache.delete(key));
  }
  return loading;
}

const cache = new Map<string, Promise<Tokenizer>>();

async function load(spec: TokenizerSpec): Promise<Tokenizer> {
  switch (spec.kind) {
    case 'byte':
      return byteTokenizer();
    case 'r50k_base':
      return loadR50kTokenizer();
    case 'hf':
      try {
        return await loadHfTokenizer(spec.path);
      } catch (err) {
        throw new TokenizerLoadError(`cannot load tokenizer ${spec.path}: ${(err as Error).message}`);
      }
    default: {
      const never: never = spec;
      throw new TokenizerLoadError(`unknown tokenizer kind ${JSON.stringify(never)}`);
    }
  }
}
