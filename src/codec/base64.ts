// Padded standard base64 decoded into a caller's buffer in pieces of any size (a harvest's capture text,
// handed over by the codec reader as it reads the body): strict about characters, padding and room.
import { Buffer } from 'node:buffer';
import { CodecError } from './errors.ts';
import { base64DecodedLength } from './wire.ts';

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

function latin1(buf: Uint8Array, from: number, to: number): string {
  return Buffer.from(buf.buffer, buf.byteOffset + from, to - from).toString('latin1');
}
