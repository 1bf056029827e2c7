/**
 * The key format and its secret: `svc_<prefix>_<secret>`, prefix = 12 lowercase hex characters (6
 * random bytes), secret = 43 base64url characters (32 random bytes). Only the sha256 of the secret
 * is stored; a 256-bit random secret needs no salt or slow hash (nothing to brute-force).
 */
import { hash, randomBytes, timingSafeEqual } from 'node:crypto';

const keyPattern = /^svc_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$/;
export const prefixPattern = /^[0-9a-f]{12}$/;

export interface MintedKey {
  key: string;
  prefix: string;
  secretSha256: string;
}

export function mintKey(): MintedKey {
  const prefix = randomBytes(6).toString('hex');
  const secret = randomBytes(32).toString('base64url');
  return { key: `svc_${prefix}_${secret}`, prefix, secretSha256: sha256(secret).toString('hex') };
}

/** The prefix and secret of a well-formed key, or null. */
export function parseKey(token: string): { prefix: string; secret: string } | null {
  const m = keyPattern.exec(token);
  return m ? { prefix: m[1], secret: m[2] } : null;
}

/** One-shot: a Hash object per call cost twice as much, at every authenticated request. */
export function sha256(value: string): Buffer {
  return hash('sha256', value, 'buffer');
}

/** Whether the presented secret hashes to the stored hash, in time independent of where they differ. */
export function secretMatches(secret: string, storedSha256Hex: string): boolean {
  const stored = Buffer.from(storedSha256Hex, 'hex');
  const presented = sha256(secret);
  return stored.length === presented.length && timingSafeEqual(presented, stored);
}

/**
 * Compares two tokens of any length in constant time: both are hashed first, so neither the place of
 * the first difference nor the expected length leaks (the admin token).
 */
export function tokensMatch(presented: string, expected: string): boolean {
  return timingSafeEqual(sha256(presented), sha256(expected));
}

/** The token of an `Authorization: Bearer <token>` header; null when missing; '' when not a bearer header. */
export function bearerToken(header: string | undefined): string | null {
  if (header === undefined || header === '') return null;
  const m = /^Bearer[ \t]+(\S+)[ \t]*$/i.exec(header);
  return m ? m[1] : '';
}
