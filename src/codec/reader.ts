// The capture reader: finds a codec envelope (by default `activations.residual_stream`) in an engine's
// JSON response as its bytes arrive, without turning the body into a string and without parsing the
// tensor. It keeps only the small fields (shape, dtype, original_dtype, compression) and where the
// base64 `data` text begins and ends. The gateway relays a capture with it; a harvest worker has the
// text handed to it as it is read (`CodecDataSink`) and decodes it with `Base64Decoder`, in bounded pieces.
import { Buffer } from 'node:buffer';
import { CodecError } from './errors.ts';
import {
  base64DecodedLength,
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
 * with native searches for the closing quote, so the base64 text costs a memchr, not a byte loop.
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

/**
 * Largest piece of base64 text decoded at once (64 KiB of characters): bounds every temporary string, and
 * keeps it out of V8's large-object space, where each piece cost an mmap and an munmap (1 MiB pieces spent
 * 0.7-1.2 s of system CPU per GB decoded; 64 KiB ones none).
 */
const DECODE_PIECE = 64 * 1024;

/**
 * A faster decoder of part of the text: decodes a prefix of `text` (whole quads of the standard alphabet,
 * no padding; it may stop short of a stray character) into `dest` from `at` and returns its length in characters (0: none).
 */
export type Base64Prefix = (text: Uint8Array, dest: Uint8Array, at: number) => number;

/** Each byte's 6 bits in the standard base64 alphabet, -1 for any other byte. */
const SEXTETS = new Int8Array(256).fill(-1);
for (const [i, c] of [...'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'].entries()) SEXTETS[c.charCodeAt(0)] = i;

/**
 * Decodes padded standard base64 text, given in pieces of any size, straight into `dest`. No string
 * longer than 64 KiB is ever made. Invalid characters, misplaced padding and overflowing `dest` throw
 * `CodecError`. With `prefix`, each piece is decoded by it as far as it goes, and the rest as here.
 */
export class Base64Decoder {
  #dest: Buffer;
  #at: number;
  readonly #carry = Buffer.alloc(4);
  #carryLength = 0;
  #padded = false;
  readonly #prefix: Base64Prefix | null;

  constructor(dest: Uint8Array, offset = 0, prefix: Base64Prefix | null = null) {
    this.#dest = Buffer.from(dest.buffer, dest.byteOffset, dest.byteLength);
    this.#at = offset;
    this.#prefix = prefix;
  }

  /** Bytes written into `dest` so far. */
  get written(): number {
    return this.#at;
  }

  /** Room left in `dest`. */
  get room(): number {
    return this.#dest.length - this.#at;
  }

  /** Goes on in `dest` (at least as long as what is written), what was written so far copied there first. */
  moveTo(dest: Uint8Array): void {
    const next = Buffer.from(dest.buffer, dest.byteOffset, dest.byteLength);
    this.#dest.copy(next, 0, 0, this.#at);
    this.#dest = next;
  }

  /** Starts again from the beginning of `dest`, as new. */
  reset(): void {
    this.#at = 0;
    this.#carryLength = 0;
    this.#padded = false;
  }

  write(text: Uint8Array): void {
    let i = 0;
    const n = text.length;
    if (n > 0 && this.#padded) throw new CodecError('base64 text continues after its padding');
    if (this.#carryLength > 0) {
      while (this.#carryLength < 4 && i < n) this.#carry[this.#carryLength++] = text[i++];
      if (this.#carryLength < 4) return;
      this.#decode(this.#carry);
      this.#carryLength = 0;
    }
    while (n - i >= 4) {
      const take = Math.min(DECODE_PIECE, (n - i) & ~3);
      this.#decode(text.subarray(i, i + take));
      i += take;
    }
    while (i < n) this.#carry[this.#carryLength++] = text[i++];
  }

  /**
   * Decodes the run of standard-alphabet characters at `text[from..to)` and returns the index of the first
   * character not in it (`to` when all are); the characters from there on go to `write`. Takes nothing
   * after padding or after a carried character not of the alphabet (`write` then sees them as it would).
   */
  run(text: Uint8Array, from: number, to: number): number {
    if (this.#padded) return from;
    let i = from;
    const carry = this.#carry;
    for (let k = 0; k < this.#carryLength; k++) if (SEXTETS[carry[k]] < 0) return from;
    while (this.#carryLength > 0 && this.#carryLength < 4 && i < to && SEXTETS[text[i]] >= 0) carry[this.#carryLength++] = text[i++];
    if (this.#carryLength > 0) {
      if (this.#carryLength < 4) return i;
      this.#quad(carry, 0);
      this.#carryLength = 0;
    }
    if (this.#prefix !== null && to - i >= 64) {
      const room = Math.floor(this.room / 3) * 4;
      const done = this.#prefix(text.subarray(i, i + Math.min(to - i, room)), this.#dest, this.#at);
      this.#at += (done / 4) * 3;
      i += done;
    }
    for (; i + 4 <= to; i += 4) {
      if ((SEXTETS[text[i]] | SEXTETS[text[i + 1]] | SEXTETS[text[i + 2]] | SEXTETS[text[i + 3]]) < 0) break;
      this.#quad(text, i);
    }
    while (i < to && SEXTETS[text[i]] >= 0) carry[this.#carryLength++] = text[i++];
    return i;
  }

  /** One quad of the standard alphabet at `text[i]`, decoded into `dest`. */
  #quad(text: Uint8Array, i: number): void {
    if (this.#at + 3 > this.#dest.length) throw new CodecError('base64 text decodes to more bytes than the destination holds');
    const bits = (SEXTETS[text[i]] << 18) | (SEXTETS[text[i + 1]] << 12) | (SEXTETS[text[i + 2]] << 6) | SEXTETS[text[i + 3]];
    const dest = this.#dest;
    dest[this.#at] = bits >>> 16;
    dest[this.#at + 1] = (bits >>> 8) & 0xff;
    dest[this.#at + 2] = bits & 0xff;
    this.#at += 3;
  }

  /** The text ended: returns the offset in `dest` after the last byte written. */
  end(): number {
    if (this.#carryLength !== 0) throw new CodecError('base64 text length is not a multiple of 4');
    return this.#at;
  }

  #decode(whole: Uint8Array): void {
    if (this.#padded) throw new CodecError('base64 text continues after its padding');
    let quads = whole;
    let n = quads.length;
    let padding = 0;
    if (quads[n - 1] === 0x3d) padding = quads[n - 2] === 0x3d ? 2 : 1;
    let expected = base64DecodedLength(n, padding);
    if (this.#at + expected > this.#dest.length) throw new CodecError('base64 text decodes to more bytes than the destination holds');
    if (this.#prefix !== null && n >= 64) {
      const done = this.#prefix(quads, this.#dest, this.#at);
      if (done === n) {
        this.#at += expected;
        return;
      }
      this.#at += (done / 4) * 3;
      expected -= (done / 4) * 3;
      quads = quads.subarray(done);
      n -= done;
    }
    // An invalid character (or '=' before the end) is skipped by Node's decoder, so fewer bytes come out.
    const written = this.#dest.write(latin1(quads, 0, n), this.#at, expected, 'base64');
    if (written !== expected || (padding === 0 && quads.indexOf(0x3d) >= 0) || (padding > 0 && quads.subarray(0, n - padding).indexOf(0x3d) >= 0)) {
      throw new CodecError('the data is not padded standard base64');
    }
    this.#at += written;
    if (padding > 0) this.#padded = true;
  }
}
