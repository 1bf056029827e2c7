// Byte-level vocabulary: ids 0..255 are bytes, 256 is BOS, 257 is EOS.
import type { Tokenizer } from './types.ts';
import { TokenTable, byteToUnicode } from './table.ts';

export const BYTE_BOS = 256;
export const BYTE_EOS = 257;
const BOS_TEXT = '<|bos|>';
const EOS_TEXT = '<|eos|>';

const encoder = new TextEncoder();

export function byteTokenizer(): Tokenizer {
  const bytes: Uint8Array[] = [];
  for (let b = 0; b < 256; b++) bytes.push(Uint8Array.of(b));
  bytes.push(encoder.encode(BOS_TEXT), encoder.encode(EOS_TEXT));
  const table = new TokenTable(bytes, new Set([BYTE_BOS, BYTE_EOS]), (id) =>
    id === BYTE_BOS ? BOS_TEXT : id === BYTE_EOS ? EOS_TEXT : (byteToUnicode[id] ?? ''),
  );
  return {
    kind: 'byte',
    vocabSize: 258,
    bosId: BYTE_BOS,
    eosId: BYTE_EOS,
    // Special-token text in a prompt is encoded as plain bytes: a prompt cannot forge BOS/EOS.
    encode(text, addSpecialTokens) {
      const raw = encoder.encode(text);
      const out = new Array<number>(raw.length + (addSpecialTokens ? 1 : 0));
      let at = 0;
      if (addSpecialTokens) out[at++] = BYTE_BOS;
      for (let i = 0; i < raw.length; i++) out[at++] = raw[i];
      return out;
    },
    minTokens: (text, addSpecialTokens) => Buffer.byteLength(text, 'utf8') + (addSpecialTokens ? 1 : 0),
    minTokensExact: true,
    ...table.lookups(),
  };
}
