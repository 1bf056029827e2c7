// GPT-2's r50k_base BPE (50257 ids) from gpt-tokenizer's offline rank table; <|endoftext|> is BOS and EOS.
import type { Tokenizer } from './types.ts';
import { TokenTable, bytesToPiece } from './table.ts';

const ENDOFTEXT = '<|endoftext|>';
const ENDOFTEXT_ID = 50256;

export async function loadR50kTokenizer(): Promise<Tokenizer> {
  const [{ default: ranks }, encoding] = await Promise.all([
    import('gpt-tokenizer/bpeRanks/r50k_base'),
    import('gpt-tokenizer/encoding/r50k_base'),
  ]);
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
  // gpt-tokenizer does not map an allowed special token back to its id for r50k_base, so the text is
  // split on it here; like a Hugging Face GPT-2 tokenizer, its text in a prompt becomes the special token.
  const options = { disallowedSpecial: new Set<string>() };
  const encodeText = (text: string): number[] => {
    if (!text.includes(ENDOFTEXT)) return encoding.encode(text, options);
    const ids: number[] = [];
    text.split(ENDOFTEXT).forEach((part, i) => {
      if (i > 0) ids.push(ENDOFTEXT_ID);
      if (part.length) for (const id of encoding.encode(part, options)) ids.push(id);
    });
    return ids;
  };
  return {
    kind: 'r50k_base',
    vocabSize: ENDOFTEXT_ID + 1,
    bosId: ENDOFTEXT_ID,
    eosId: ENDOFTEXT_ID,
    encode(text, addSpecialTokens) {
      const ids = text.length === 0 ? [] : encodeText(text);
      if (addSpecialTokens) ids.unshift(ENDOFTEXT_ID);
      return ids;
    },
    ...table.lookups(),
  };
}
