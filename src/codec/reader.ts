// The capture reader: finds a codec envelope (by default `activations.residual_stream`) in an engine's
// JSON response as its bytes arrive, without turning the body into a string and without parsing the
// tensor. It keeps only the small fields (shape, dtype, original_dtype, compression) and where the
// base64 `data` text begins and ends. The gateway relays a capture with it; a harvest worker has the
// text handed to it as it is read (`CodecDataSink`) and decodes it with `Base64Decoder` (base64.ts).
import { Buffer } from 'node:buffer';
import { CodecError } from './errors.ts';
import {
  base64EncodedLength,
  isCodecDtype,
  tensorByteLength,
  zstdContentSizeOfBase64,
  ZSTD_HEADER_BASE64_CHARS,
  type CodecDtype,
} from './wire.ts';

/** Where the residual stream sits in a vLLM + vllm-lens completion (ENGINE.md, "Responses"). */
export const RESIDUAL_STREAM_PATH: readonly string[] = ['activations', 'residual_stream'];

/**
 * Receives the envelope's base64 text as the scanner reads it: `start` when a `data` string begins (the
 * last envelope wins: text before is dropped), then its bytes between the quotes in order, in pieces.
 */
export interface CodecDataSink {
  start(): void;
  text(piece: Uint8Array): void;
  /**
   * Optional: takes the text from `buf[from]` up to its first character not of the standard base64
   * alphabet (or `to`) and returns that character's index; what follows comes through `text`.
   */
  run?(buf: Uint8Array, from: number, to: number): number;
}

/** A codec envelope found in a body: its small fields, and where its base64 text lies. */
export interface CodecLocation {
  shape: number[];
  dtype: CodecDtype;
  originalDtype: string | null;
  compression: 'zstd' | null;
  /** Raw tensor bytes once decoded (and decompressed): prod(shape) × itemsize. */
  byteLength: number;
  /** Absolute byte offsets of the base64 text in the body, between the quotes: [dataStart, dataEnd). */
  dataStart: number;
  dataEnd: number;
}

// Scanner modes: what the next significant byte may be.
const VALUE = 0; // a value (or `]` right after `[`)
const KEY = 1; // a member's key (or `}` right after `{`)
const COLON = 2;
const COMMA = 3; // `,` or the container's closing bracket
const STRING = 4;
const NUMBER = 5;
const LITERAL = 6;
const DONE = 7; // the top-level value ended: whitespace only

const OBJECT = 0;
const ARRAY = 1;

// What a string being scanned is.
const KEY_TEXT = 0;
const SMALL_TEXT = 1; // a codec field we keep
const SKIPPED_TEXT = 2;
const DATA_TEXT = 3;

/** Longest key or small field the reader keeps; longer ones are not what it looks for. */
const SMALL_LIMIT = 256;
const INVALID = Symbol('invalid');
const DATA = Symbol('data');
type Small = string | null | typeof INVALID;

const LITERALS: Record<number, string> = { 0x74: 'true', 0x66: 'false', 0x6e: 'null' };

function isSpace(b: number): boolean {
  return b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;
}

function isNumberByte(b: number): boolean {
  return (b >= 0x30 && b <= 0x39) || b === 0x2d || b === 0x2b || b === 0x2e || b === 0x65 || b === 0x45;
}

const NUMBER_TEXT = /^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?$/;

/**
 * Reads a JSON body chunk by chunk (chunks may split it anywhere: inside keys, escapes or base64 quads)
 * and checks its structure as it goes; a malformed body throws `CodecError`. Big strings are skipped
 * with native searches for the closing quote, so the base64 text costs a memchr, not a byte loop; a
 * sink with `run` takes the data's base64 itself and says where it stops, so that text is not searched.
 */
export class CodecScanner {
  readonly #path: readonly string[];
  #offset = 0; // absolute offset of the current chunk's first byte
  #mode = VALUE;
  #afterOpen = false; // `[` or `{` just opened: the closing bracket may follow at once
  readonly #stack: number[] = [];
  readonly #keys: (string | null)[] = []; // the current member's key per open object (null per array)
  // The string being scanned.
  #textRole = SKIPPED_TEXT;
  #text = '';
  #textLong = false;
  #escape = 0; // 0: none; 1: after a backslash; 2..5: hex digits of \uXXXX still to come, plus one
  #number = '';
  #keepNumber = false;
  #literal = '';
  #literalAt = 0;
  // The codec.
  #codecDepth: number;
  #inCodec = false;
  #codecSeen = false;
  #codecClosed = false;
  #field: string | null = null; // the codec member whose value is being read
  #shape: number[] | typeof INVALID | null = null;
  #small = new Map<string, Small>();
  #dataStart = -1;
  #dataEnd = -1;
  #dataInvalid = false;
  #dataHead = '';

  readonly #sink: CodecDataSink | null;

  /** With `sink`, the envelope's base64 text is handed to it as it is read (a harvest decodes it at once). */
  constructor(path: readonly string[] = RESIDUAL_STREAM_PATH, sink: CodecDataSink | null = null) {
    this.#path = path;
    this.#codecDepth = path.length + 1;
    this.#sink = sink;
  }

  /** Bytes read so far. */
  get bytesRead(): number {
    return this.#offset;
  }

  /** True once the codec object's closing brace has been read: every field of the envelope is known. */
  get codecClosed(): boolean {
    return this.#codecClosed;
  }

  /** True once the top-level JSON value is complete. */
  get complete(): boolean {
    return this.#mode === DONE;
  }

  push(chunk: Uint8Array): void {
    const buf = chunk;
    const n = buf.length;
    let i = 0;
    try {
      while (i < n) {
        switch (this.#mode) {
          case STRING:
            i = this.#scanString(buf, i);
            break;
          case NUMBER: {
            const start = i;
            while (i < n && isNumberByte(buf[i])) i++;
            if (this.#number.length < 32) this.#number += latin1(buf, start, i);
            if (i < n) this.#endNumber();
            break;
          }
          case LITERAL: {
            const b = buf[i++];
            if (b !== this.#literal.charCodeAt(this.#literalAt++)) throw this.#bad(`invalid literal (expected ${this.#literal})`, i - 1);
            if (this.#literalAt === this.#literal.length) this.#valueEnd(this.#literal === 'null' ? null : INVALID);
            break;
          }
          default: {
            const b = buf[i++];
            if (!isSpace(b)) this.#token(b, i - 1);
          }
        }
      }
    } finally {
      this.#offset += n;
    }
  }

  /** The body ended: throws unless it held one whole JSON value. */
  end(): void {
    if (this.#mode === NUMBER && this.#stack.length === 0) this.#endNumber();
    if (this.#mode !== DONE) throw new CodecError(`the body ended at byte ${this.#offset} inside its JSON value`);
  }

  /**
   * The codec envelope with its fields checked against each other: null when the body holds none (it was
   * absent, or not an object). A malformed envelope throws `CodecError`. Call once `codecClosed`.
   */
  codec(): CodecLocation | null {
    if (!this.#codecSeen) return null;
    if (!this.#codecClosed) throw new CodecError('the codec envelope is not complete');
    const shape = this.#shape;
    if (shape === null) throw new CodecError('the codec envelope has no shape');
    if (shape === INVALID || shape.length === 0) throw new CodecError('the codec shape is not a non-empty list of non-negative integers');
    const dtype = this.#small.get('dtype');
    if (dtype === undefined || dtype === null || dtype === INVALID || !isCodecDtype(dtype)) {
      throw new CodecError(`the codec dtype ${dtype === INVALID || dtype === undefined ? '(missing or not a string)' : JSON.stringify(dtype)} is not a numpy dtype`);
    }
    const original = this.#small.get('original_dtype') ?? null;
    if (original === INVALID) throw new CodecError('the codec original_dtype is not a string');
    const compression = this.#small.get('compression') ?? null;
    if (compression === INVALID || (compression !== null && compression !== 'zstd')) {
      throw new CodecError(`the codec compression ${compression === INVALID ? '(not a string)' : JSON.stringify(compression)} is not supported (zstd or none)`);
    }
    if (this.#dataStart < 0 || this.#dataInvalid) throw new CodecError('the codec data is not a base64 string');
    const byteLength = tensorByteLength(shape, dtype);
    const chars = this.#dataEnd - this.#dataStart;
    if (chars % 4 !== 0) throw new CodecError(`the codec data is not padded base64 (${chars} characters)`);
    if (compression === null) {
      if (chars !== base64EncodedLength(byteLength)) {
        throw new CodecError(`the codec data holds ${chars} base64 characters; shape [${shape.join(', ')}] of ${dtype} needs ${base64EncodedLength(byteLength)}`);
      }
    } else {
      const size = zstdContentSizeOfBase64(this.#dataHead);
      if (size === 'not-zstd') throw new CodecError('the codec compression is "zstd" but the data is not a zstd frame');
      if (size !== null && size !== byteLength) {
        throw new CodecError(`the codec zstd frame holds ${size} bytes; shape [${shape.join(', ')}] of ${dtype} needs ${byteLength}`);
      }
    }
    return { shape: shape.slice(), dtype, originalDtype: original, compression, byteLength, dataStart: this.#dataStart, dataEnd: this.#dataEnd };
  }

  /** The first dimension of the envelope's shape when it was read as a list of integers (layers of a capture). */
  get leadingDimension(): number | null {
    return Array.isArray(this.#shape) && this.#shape.length > 0 ? this.#shape[0] : null;
  }

  #bad(what: string, at: number): CodecError {
    return new CodecError(`the body is not valid JSON at byte ${this.#offset + at}: ${what}`);
  }

  /** A structural byte outside strings, numbers and literals. */
  #token(b: number, at: number): void {
    const afterOpen = this.#afterOpen;
    this.#afterOpen = false;
    switch (this.#mode) {
      case VALUE:
        if (b === 0x5d && afterOpen && this.#top() === ARRAY) return this.#close(ARRAY, at);
        return this.#valueStart(b, at);
      case KEY:
        if (b === 0x7d && afterOpen) return this.#close(OBJECT, at);
        if (b !== 0x22) throw this.#bad('expected a key', at);
        this.#startString(KEY_TEXT);
        return;
      case COLON:
        if (b !== 0x3a) throw this.#bad("expected ':'", at);
        this.#mode = VALUE;
        return;
      case COMMA: {
        const top = this.#top();
        if (b === 0x2c) {
          this.#mode = top === OBJECT ? KEY : VALUE;
          return;
        }
        if (b === 0x7d && top === OBJECT) return this.#close(OBJECT, at);
        if (b === 0x5d && top === ARRAY) return this.#close(ARRAY, at);
        throw this.#bad("expected ',' or a closing bracket", at);
      }
      case DONE:
        throw this.#bad('bytes after the JSON value', at);
    }
  }

  #top(): number {
    return this.#stack[this.#stack.length - 1];
  }

  /** Which codec member (or shape element) a value starting now is, if any. */
  #where(): 'member' | 'shape-element' | 'codec' | null {
    const depth = this.#stack.length;
    if (depth === this.#codecDepth && this.#inCodec) return 'member';
    if (depth === this.#codecDepth + 1 && this.#inCodec && this.#top() === ARRAY && this.#field === 'shape') return 'shape-element';
    if (depth === this.#path.length && this.#onPath()) return 'codec';
    return null;
  }

  #onPath(): boolean {
    for (let d = 0; d < this.#path.length; d++) if (this.#stack[d] !== OBJECT || this.#keys[d] !== this.#path[d]) return false;
    return true;
  }

  #valueStart(b: number, at: number): void {
    const where = this.#where();
    if (where === 'member') this.#field = this.#keys[this.#codecDepth - 1];
    if (b === 0x7b || b === 0x5b) {
      if (where === 'codec' && b === 0x7b) {
        // The last envelope wins, as with JSON.parse.
        this.#inCodec = true;
        this.#codecSeen = true;
        this.#codecClosed = false;
        this.#shape = null;
        this.#small.clear();
        this.#dataStart = this.#dataEnd = -1;
        this.#dataInvalid = false;
      } else if (where === 'member' && this.#field === 'shape' && b === 0x5b) {
        this.#shape = [];
      } else if (where === 'member' || where === 'shape-element') {
        this.#memberValue(INVALID);
      } else if (where === 'codec') {
        this.#codecSeen = false;
      }
      this.#stack.push(b === 0x7b ? OBJECT : ARRAY);
      this.#keys.push(null);
      this.#mode = b === 0x7b ? KEY : VALUE;
      this.#afterOpen = true;
      return;
    }
    if (where === 'codec') this.#codecSeen = false;
    if (b === 0x22) {
      const field = where === 'member' ? this.#field : null;
      if (field === 'data') {
        this.#dataStart = this.#offset + at + 1;
        this.#dataInvalid = false;
        this.#dataHead = '';
        this.#sink?.start();
        this.#startString(DATA_TEXT);
      } else {
        this.#startString(field === 'dtype' || field === 'original_dtype' || field === 'compression' ? SMALL_TEXT : SKIPPED_TEXT);
        if (where === 'shape-element') this.#shape = INVALID;
      }
      return;
    }
    if (b === 0x2d || (b >= 0x30 && b <= 0x39)) {
      this.#mode = NUMBER;
      this.#number = String.fromCharCode(b);
      this.#keepNumber = where === 'shape-element';
      return;
    }
    const literal = LITERALS[b];
    if (literal === undefined) throw this.#bad(`unexpected ${JSON.stringify(String.fromCharCode(b))}`, at);
    this.#mode = LITERAL;
    this.#literal = literal;
    this.#literalAt = 1;
    if (where === 'shape-element') this.#shape = INVALID;
  }

  #startString(role: number): void {
    this.#mode = STRING;
    this.#textRole = role;
    this.#text = '';
    this.#textLong = false;
    this.#escape = 0;
  }

  /** Scans string bytes from `i`; returns where scanning stopped (the chunk's end or past the closing quote). */
  #scanString(buf: Uint8Array, i: number): number {
    const n = buf.length;
    while (i < n) {
      if (this.#escape > 0) {
        const b = buf[i++];
        if (this.#escape === 1) {
          if (b === 0x75) this.#escape = 5; // \uXXXX
          else if (b === 0x22 || b === 0x5c || b === 0x2f || b === 0x62 || b === 0x66 || b === 0x6e || b === 0x72 || b === 0x74) this.#escape = 0;
          else throw this.#bad('invalid escape in a string', i - 1);
        } else {
          const hex = (b >= 0x30 && b <= 0x39) || ((b | 0x20) >= 0x61 && (b | 0x20) <= 0x66);
          if (!hex) throw this.#bad('invalid \\u escape in a string', i - 1);
          this.#escape = this.#escape === 2 ? 0 : this.#escape - 1;
        }
        this.#keep(buf, i - 1, i);
        continue;
      }
      if (this.#textRole === DATA_TEXT && this.#sink?.run !== undefined) {
        const stop = this.#sink.run(buf, i, n);
        if (stop > i && this.#dataHead.length < ZSTD_HEADER_BASE64_CHARS) this.#dataHead += latin1(buf, i, Math.min(stop, i + ZSTD_HEADER_BASE64_CHARS - this.#dataHead.length));
        i = stop;
        if (i === n) return n;
      }
      const quote = indexOf(buf, 0x22, i);
      const stop = quote < 0 ? n : quote;
      const backslash = indexOfBefore(buf, 0x5c, i, stop);
      const upto = backslash < 0 ? stop : backslash;
      this.#keep(buf, i, upto);
      if (backslash >= 0) {
        if (this.#textRole === DATA_TEXT) this.#dataInvalid = true; // base64 holds no backslash
        this.#keep(buf, backslash, backslash + 1);
        this.#escape = 1;
        i = backslash + 1;
        continue;
      }
      if (quote < 0) return n;
      this.#endString(quote);
      return quote + 1;
    }
    return i;
  }

  /** Keeps string bytes [from, to) when the string is a key, a small field or the head of the data. */
  #keep(buf: Uint8Array, from: number, to: number): void {
    if (to <= from) return;
    const role = this.#textRole;
    if (role === SKIPPED_TEXT) return;
    if (role === DATA_TEXT) {
      this.#sink?.text(buf.subarray(from, to));
      if (this.#dataHead.length < ZSTD_HEADER_BASE64_CHARS) this.#dataHead += latin1(buf, from, Math.min(to, from + ZSTD_HEADER_BASE64_CHARS - this.#dataHead.length));
      return;
    }
    if (this.#textLong) return;
    if (this.#text.length + (to - from) > SMALL_LIMIT) {
      this.#textLong = true;
      return;
    }
    this.#text += latin1(buf, from, to);
  }

  #endString(quoteAt: number): void {
    const role = this.#textRole;
    // Keys and small fields are compared byte for byte: an escaped or non-ASCII key is not one we look for.
    const text = this.#textLong || /[\\\x80-\xff]/.test(this.#text) ? null : this.#text;
    if (role === KEY_TEXT) {
      this.#keys[this.#keys.length - 1] = text ?? '\0';
      this.#mode = COLON;
      return;
    }
    if (role === DATA_TEXT) this.#dataEnd = this.#offset + quoteAt;
    this.#valueEnd(role === DATA_TEXT ? DATA : role === SMALL_TEXT ? (text ?? INVALID) : INVALID);
  }

  #endNumber(): void {
    const text = this.#number;
    const valid = text.length >= 32 || NUMBER_TEXT.test(text);
    if (!valid) throw new CodecError(`the body is not valid JSON before byte ${this.#offset}: invalid number ${JSON.stringify(text)}`);
    if (this.#keepNumber) {
      const value = Number(text);
      if (!Number.isSafeInteger(value) || value < 0) this.#shape = INVALID;
      else if (Array.isArray(this.#shape)) this.#shape.push(value);
    }
    this.#valueEnd(INVALID);
  }

  /**
   * A scalar value ended. `value` is what it means to the codec: the text of a kept string, null for the
   * literal null, DATA for the base64 text, INVALID for anything else.
   */
  #valueEnd(value: Small | typeof DATA): void {
    const depth = this.#stack.length;
    if (this.#inCodec) {
      if (depth === this.#codecDepth) this.#memberValue(value);
    }
    this.#mode = depth === 0 ? DONE : COMMA;
  }

  /** A codec member's whole value: strings or null for the small fields, base64 text for data. */
  #memberValue(value: Small | typeof DATA): void {
    const field = this.#field;
    if (field === 'dtype' || field === 'original_dtype' || field === 'compression') this.#small.set(field, value === DATA ? INVALID : value);
    else if (field === 'shape') this.#shape = INVALID; // a scalar (the list is read element by element)
    else if (field === 'data' && value !== DATA) {
      this.#dataStart = -1;
      this.#dataInvalid = true;
    }
  }

  #close(kind: number, at: number): void {
    if (this.#top() !== kind) throw this.#bad('mismatched closing bracket', at);
    const depth = this.#stack.length;
    if (depth === this.#codecDepth && this.#inCodec && kind === OBJECT) {
      this.#inCodec = false;
      this.#codecClosed = true;
    }
    this.#stack.pop();
    this.#keys.pop();
    this.#mode = this.#stack.length === 0 ? DONE : COMMA;
  }
}

function latin1(buf: Uint8Array, from: number, to: number): string {
  return Buffer.from(buf.buffer, buf.byteOffset + from, to - from).toString('latin1');
}

function indexOf(buf: Uint8Array, byte: number, from: number): number {
  return buf.indexOf(byte, from);
}

/** Index of `byte` in [from, to), or -1. Short spans are looped; long ones searched natively. */
function indexOfBefore(buf: Uint8Array, byte: number, from: number, to: number): number {
  if (to - from < 64) {
    for (let i = from; i < to; i++) if (buf[i] === byte) return i;
    return -1;
  }
  const found = buf.subarray(from, to).indexOf(byte);
  return found < 0 ? -1 : from + found;
}
