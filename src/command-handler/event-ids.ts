import { hash } from 'node:crypto';

/** RFC 4122 name-based (version 5, SHA-1) UUIDs under one namespace of our own. */
const namespace = Buffer.from('6c0c8f3e4a0d5b8e9a1f2b3c4d5e6f70', 'hex');

/** The variant nibble (10xx) for each hex digit of the hash there. */
const variant = '89ab89ab89ab89ab';

/**
 * The id of a command's `index`-th event: the same command (same id) always yields the same event
 * ids, so sending it again after a lost acknowledgement appends nothing twice. A one-shot hash, the
 * version and variant bits set on its hex form: the same ids as setting them on the bytes.
 */
export function eventIdFor(commandId: string, index: number): string {
  const hex = hash('sha1', Buffer.concat([namespace, Buffer.from(`${commandId}\u0000${index}`)]), 'hex');
  return `${hex.slice(0, 8)}-${hex.slice(8, 12)}-5${hex.slice(13, 16)}-${variant[parseInt(hex[16], 16)]}${hex.slice(17, 20)}-${hex.slice(20, 32)}`;
}
