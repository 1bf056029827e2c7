/**
 * A harvest's estimated tokens, as the contract's submit check counts them: characters divided by 4,
 * where a character is a code point (a surrogate pair, an emoji say, is one, not two UTF-16 units).
 */
export function estimateTokens(prompts: readonly string[]): number {
  let characters = 0;
  for (const prompt of prompts) characters += codePoints(prompt);
  return Math.ceil(characters / 4);
}

/** Code points of a string in one pass, nothing allocated (`[...text].length` would build an array of them). */
export function codePoints(text: string): number {
  let count = text.length;
  const last = text.length - 1;
  for (let i = 0; i < last; i++) {
    const unit = text.charCodeAt(i);
    if (unit >= 0xd800 && unit <= 0xdbff) {
      const next = text.charCodeAt(i + 1);
      if (next >= 0xdc00 && next <= 0xdfff) {
        count--;
        i++;
      }
    }
  }
  return count;
}
