// The tokenizer module shared by the gateway (prompt token counting) and the reference engine.
import type { Tokenizer, TokenizerSpec } from './types.ts';
import { byteTokenizer } from './byte.ts';
import { loadR50kTokenizer } from './r50k.ts';
import { loadHfTokenizer } from './hf.ts';

export type { Tokenizer, StreamDecoder, TokenizerSpec } from './types.ts';

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

export { TokenizerPool, TokenizerThreadError, OFF_THREAD_UNITS, OFF_THREAD_JSON_BYTES, countTokens, encodeTexts } from './pool.ts';
