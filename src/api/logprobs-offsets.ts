/**
 * `logprobs.text_offset` as the contract states it: byte offsets into `text`. vLLM (and the reference
 * engine, which speaks its protocol) counts characters instead, the sum of each token string's Python
 * `len`, and with `echo` counts the beginning-of-text token's string (`<s>`, `<|bos|>`), which `text`
 * does not hold. So the gateway works the offsets out again from what the choice carries, `text` and
 * `tokens`, whatever the engine sent: each token is found in the UTF-8 bytes of the text where the
 * previous one ended, and its offset is where it starts.
 *
 * - A token whose string is in the text there takes its bytes.
 * - A token that is part of a multi-byte character is shown as U+FFFD (vLLM decodes each token alone);
 *   each U+FFFD stands for 1 to 3 bytes, and the bytes it takes are those that decode to the token's
 *   string (one token of look-ahead settles which, so an emoji split over two tokens gives the second
 *   the offset of its third byte, say).
 * - A token absent from the text (the BOS of an echoed prompt, the EOS that ends a choice, the token
 *   that holds a stop string cut from the text) takes no bytes: its offset is where the text goes on.
 *
 * On a stream, offsets count from the start of the choice's whole text (the frames before included),
 * as vLLM's count does; a token whose text the engine holds back (an unfinished character, a possible
 * stop string) is given the offset where that text will start and is matched against it when it comes.
 *
 * Only the numbers of `text_offset` change: the body's other bytes are relayed as the engine wrote them.
 */

const REPLACEMENT = '\uFFFD';
const decoder = new TextDecoder('utf-8', { fatal: false, ignoreBOM: true });
const encoder = new TextEncoder();

/** One choice's offsets across the frames of a stream (a single use for a whole body). */
export class ChoiceOffsets {
  /** Bytes of the choice's text before the current frame's text. */
  #before = 0;
  /** Tokens already given offsets whose text had not come yet (held back by the engine, or cut). */
  #waiting: string[] = [];

  /** The offsets of `tokens`, which arrived with `text` (the whole text, or a stream's delta). */
  next(text: string, tokens: readonly string[]): number[] {
    const bytes = encoder.encode(text);
    // Tokens from earlier frames whose text may start this one are aligned first; their offsets were given.
    const waiting = this.#waiting;
    const steps = align(bytes, [...waiting, ...tokens]);
    // The tokens that found nothing where the text ran out wait for a later frame; behind such a token,
    // a token starts where its text will have ended.
    let firstWaiting = steps.length;
    while (firstWaiting > 0 && !steps[firstWaiting - 1].matched && steps[firstWaiting - 1].at === bytes.length) firstWaiting--;
    const all = [...waiting, ...tokens];
    const offsets = new Array<number>(tokens.length);
    let behind = 0;
    for (let i = 0; i < all.length; i++) {
      if (i >= waiting.length) offsets[i - waiting.length] = this.#before + steps[i].at + behind;
      if (i >= firstWaiting) behind += leastBytes(all[i]);
    }
    this.#waiting = all.slice(firstWaiting).filter((t) => t !== '');
    this.#before += bytes.length;
    return offsets;
  }
}

interface Step {
  /** Where the token starts in the frame's bytes. */
  at: number;
  /** Whether it was found there (false: it takes no bytes). */
  matched: boolean;
}

interface Node {
  at: number;
  score: number;
  prev: Node | null;
  /** The step that led here: the previous token matched (true) or took nothing (false). */
  matched: boolean;
}

/**
 * Where each token starts: the alignment that finds the most tokens in the text, in order (a short
 * beam over the byte positions reached, since a U+FFFD token may take 1 to 3 bytes).
 */
function align(bytes: Uint8Array, tokens: readonly string[]): Step[] {
  let beam: Node[] = [{ at: 0, score: 0, prev: null, matched: false }];
  for (const token of tokens) {
    const next = new Map<number, Node>();
    const reach = (from: Node, at: number, matched: boolean) => {
      const score = from.score + (matched ? 1 : 0);
      const known = next.get(at);
      if (!known || known.score < score) next.set(at, { at, score, prev: from, matched });
    };
    for (const node of beam) {
      for (const length of lengths(bytes, node.at, token)) reach(node, node.at + length, true);
      reach(node, node.at, false);
    }
    const ranked = [...next.values()].sort((a, b) => b.score - a.score || b.at - a.at);
    beam = ranked.filter((n, i) => i < beamWidth && n.score >= ranked[0].score - 2);
  }
  const steps = new Array<Step>(tokens.length);
  let node: Node = beam[0];
  for (let i = tokens.length - 1; i >= 0; i--) {
    const prev = node.prev!;
    steps[i] = { at: prev.at, matched: node.matched };
    node = prev;
  }
  return steps;
}

const beamWidth = 6;

/** The byte lengths `token` may take at `at`: its own bytes, or what decodes to it where it shows U+FFFD. */
function lengths(bytes: Uint8Array, at: number, token: string): number[] {
  if (token === '') return [0];
  const exact = encoder.encode(token);
  const unknown = count(token, REPLACEMENT);
  const whole = startsWith(bytes, at, exact);
  const found: number[] = whole ? [exact.length] : [];
  if (unknown === 0) return found;
  // Each U+FFFD (3 bytes in `exact`) stands for 1 to 3 bytes of the text.
  for (let length = Math.min(exact.length, bytes.length - at); length >= Math.max(1, exact.length - 2 * unknown); length--) {
    if (!(whole && length === exact.length) && decoder.decode(bytes.subarray(at, at + length)) === token) found.push(length);
  }
  return found;
}

/** The fewest bytes a token string can stand for (a U+FFFD is at least one byte). */
function leastBytes(token: string): number {
  return encoder.encode(token).length - 2 * count(token, REPLACEMENT);
}

function startsWith(bytes: Uint8Array, at: number, prefix: Uint8Array): boolean {
  if (at + prefix.length > bytes.length) return false;
  for (let i = 0; i < prefix.length; i++) if (bytes[at + i] !== prefix[i]) return false;
  return true;
}

function count(s: string, c: string): number {
  let n = 0;
  for (let i = s.indexOf(c); i >= 0; i = s.indexOf(c, i + 1)) n++;
  return n;
}

interface ChoiceWithLogprobs {
  index?: unknown;
  text?: unknown;
  logprobs?: { tokens?: unknown; text_offset?: unknown } | null;
}

/**
 * A completion body (or one SSE frame's JSON) with every choice's `text_offset` replaced by byte
 * offsets; `states` keeps each choice's position across a stream's frames (a fresh map for a body).
 * Returns the input itself when it holds no offsets, or is not the JSON it should be.
 */
export function withByteOffsets(json: string, states: Map<number, ChoiceOffsets> = new Map()): string {
  let parsed: { choices?: ChoiceWithLogprobs[] };
  try {
    parsed = JSON.parse(json);
  } catch {
    return json;
  }
  const replacements: number[][] = [];
  for (const choice of Array.isArray(parsed?.choices) ? parsed.choices : []) {
    const lp = choice?.logprobs;
    if (!lp || !Array.isArray(lp.text_offset) || !Array.isArray(lp.tokens) || typeof choice.text !== 'string') continue;
    const index = typeof choice.index === 'number' ? choice.index : 0;
    let state = states.get(index);
    if (!state) states.set(index, (state = new ChoiceOffsets()));
    replacements.push(state.next(choice.text, lp.tokens.map((t) => (typeof t === 'string' ? t : ''))));
  }
  if (replacements.length === 0) return json;
  return spliceOffsets(json, replacements);
}

const KEY = '"text_offset":';

/**
 * Replaces the arrays after each `"text_offset":` key, in order. A key is one where its quote follows
 * `{` or `,` (inside a JSON string every quote is escaped, so there it follows a backslash).
 */
function spliceOffsets(json: string, replacements: number[][]): string {
  let out = '';
  let from = 0;
  let k = 0;
  for (let at = json.indexOf(KEY); at >= 0 && k < replacements.length; at = json.indexOf(KEY, at + KEY.length)) {
    let before = at - 1;
    while (before >= 0 && isSpace(json.charCodeAt(before))) before--;
    const prev = json[before];
    if (prev !== '{' && prev !== ',') continue;
    const open = json.indexOf('[', at + KEY.length);
    const close = json.indexOf(']', open);
    if (open < 0 || close < 0) return json;
    out += json.slice(from, open) + `[${replacements[k++].join(',')}]`;
    from = close + 1;
  }
  return k === replacements.length ? out + json.slice(from) : json;
}

function isSpace(c: number): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}
