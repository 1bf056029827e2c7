/**
 * How an event's data and metadata become `jsonb`, whatever their strings hold. PostgreSQL's `jsonb`
 * refuses U+0000 (22P05) and lone UTF-16 surrogates (22P02; JSON.stringify writes them as `\udXXX`
 * escapes), and one such string used to fail its whole group-commit batch. An event holding one is
 * stored escaped instead: in every string, keys included, each of those code units and the escape
 * character itself become the escape character followed by the code unit's four hex digits, and the
 * stored metadata is marked, so that readers restore exactly the marked events, byte for byte. The
 * mapping is bijective (every escape character in an escaped event starts a sequence); events without
 * such strings, nearly all of them, are stored as they are and cost one scan of their JSON text.
 */

/** A private-use character: in a marked event it always starts a five-character escape sequence. */
const escapeChar = '\uE000';
/**
 * The metadata key that marks an escaped event. In a marked event no caller's key can equal it (the
 * escape character there is always followed by four hex digits); an unmarked event whose metadata holds
 * it is escaped, so that the mark is never the caller's.
 */
export const escapedMark = `${escapeChar}escaped`;

/** A `\u0000` or lone-surrogate escape of JSON text, not preceded by an odd run of backslashes (an escaped `\`). */
const refusedEscape = /(?<!\\)(?:\\\\)*\\u(?:0000|d[89a-f])/;
/** Escaped backslashes are matched whole, so that the `u` after `\\` is never taken for an escape. */
const escapedPieces = /\\\\|\\u(0000|d[89a-f][0-9a-f]{2})|\uE000/g;
const escapeSequence = /\uE000([0-9a-f]{4})/g;

/** Whether JSON text holds what `jsonb` refuses. `\u` is rare in JSON.stringify's output (control characters, lone surrogates). */
function refused(json: string): boolean {
  return json.includes('\\u') && refusedEscape.test(json);
}

function escapeJson(json: string): string {
  return json.replace(escapedPieces, (piece: string, hex: string | undefined) => (hex !== undefined ? escapeChar + hex : piece === escapeChar ? `${escapeChar}e000` : piece));
}

/** One append's events as JSON array elements (no brackets), ready to be joined into a batch's two arrays. */
export interface EncodedEvents {
  data: string;
  metadata: string;
}

interface EventValues {
  data?: unknown;
  metadata?: Record<string, unknown> | null;
}

/**
 * Serializes an append's data and metadata once. Throws (a TypeError) for values JSON cannot hold
 * (a BigInt, a cycle): the caller's own append fails, not its batch.
 */
export function encodeEvents(events: readonly EventValues[]): EncodedEvents {
  const data = JSON.stringify(events.map((e) => e.data ?? null));
  const metadata = JSON.stringify(events.map((e) => e.metadata ?? {}));
  if (!refused(data) && !refused(metadata) && !metadata.includes(escapedMark)) return { data: data.slice(1, -1), metadata: metadata.slice(1, -1) };
  const dataParts: string[] = [];
  const metadataParts: string[] = [];
  for (const event of events) {
    const d = JSON.stringify(event.data ?? null) ?? 'null';
    const m = JSON.stringify(event.metadata ?? {}) ?? '{}';
    if (!refused(d) && !refused(m) && !Object.hasOwn(event.metadata ?? {}, escapedMark)) {
      dataParts.push(d);
      metadataParts.push(m);
      continue;
    }
    const escaped = escapeJson(m);
    dataParts.push(escapeJson(d));
    metadataParts.push(`{${JSON.stringify(escapedMark)}:1${escaped === '{}' ? '}' : `,${escaped.slice(1)}`}`);
  }
  return { data: dataParts.join(','), metadata: metadataParts.join(',') };
}

/** Whether stored metadata marks its event as escaped. */
export function isEscaped(metadata: Record<string, unknown> | null): boolean {
  return metadata !== null && metadata[escapedMark] !== undefined;
}

function unescapeValue<T>(value: T): T {
  return JSON.parse(JSON.stringify(value).replace(escapeSequence, '\\u$1')) as T;
}

/** A marked event's data and metadata as they were appended (the mark removed). */
export function decodeEscaped(data: unknown, metadata: Record<string, unknown>): { data: unknown; metadata: Record<string, unknown> } {
  // the mark goes first: unescaped, a caller's key could read as the mark
  const { [escapedMark]: _mark, ...escaped } = metadata;
  return { data: unescapeValue(data), metadata: unescapeValue(escaped) };
}

/** A stream id or event type a `text` column keeps as it is: no U+0000, no lone surrogate. */
const unstorableText = /\0|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

export function storableText(text: string): boolean {
  return !unstorableText.test(text);
}

const unstorableOrEscape = /\0|\uE000|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g;

/**
 * A string as a `text` column (or a JSON batch cast to one) can keep it: U+0000, lone surrogates and the
 * escape character become the same escape sequences that escaped events hold (so `toStorableText('x\0')`
 * is `'x\uE0000000'`). For projections that copy client strings into tables; the identity for ordinary text.
 */
export function toStorableText(text: string): string {
  return storableText(text) && !text.includes(escapeChar) ? text : text.replace(unstorableOrEscape, (c) => escapeChar + c.charCodeAt(0).toString(16).padStart(4, '0'));
}
