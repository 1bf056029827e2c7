import { createHash } from 'node:crypto';

/** RFC 4122 name-based (version 5, SHA-1) UUIDs under one namespace of our own. */
const namespace = Buffer.from('6c0c8f3e4a0d5b8e9a1f2b3c4d5e6f70', 'hex');

/**
 * The id of a command's `index`-th event: the same command (same id) always yields the same event
 * ids, so sending it again after a lost acknowledgement appends nothing twice.
 */
export function eventIdFor(commandId: string, index: number): string {
  const hash = createHash('sha1').update(namespace).update(`${commandId}\u0000${index}`).digest();
  hash[6] = (hash[6] & 0x0f) | 0x50;
  hash[8] = (hash[8] & 0x3f) | 0x80;
  const hex = hash.toString('hex', 0, 16);
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-${hex.slice(12, 16)}-${hex.slice(16, 20)}-${hex.slice(20, 32)}`;
}
