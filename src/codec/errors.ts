/** A tensor codec envelope, or the body that should hold one, is malformed. */
export class CodecError extends Error {
  override name = 'CodecError';
}
