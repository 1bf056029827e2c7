// zstd for the tensor codec (ENGINE.md: one frame, level 1, that records its content size), through
// @bokuweb/zstd-wasm: zstd's own C source built as WebAssembly, which needs far less CPU per GB than the
// pure-JavaScript fzstd on capture-sized frames (`npm run bench -- zstd`). Loaded once, when the
// codec is first imported. A frame is never allowed to expand past the tensor its envelope announces:
// a declared content size is read from the frame header and must equal it before anything is decoded,
// and the decoder's output is bounded by it (so an undeclared size, or frames appended after the first,
// cannot grow it either).
import * as zstd from '@bokuweb/zstd-wasm';
import { CodecError } from './errors.ts';
import { zstdContentSize } from './wire.ts';

await zstd.init();

/**
 * Decompresses `frame` into `out`, which is exactly the tensor's size; returns the bytes written
 * (always out.length). Throws CodecError, before decoding, for a frame that is not zstd or that declares
 * another size, and for one that decodes to more or fewer bytes than `out` holds.
 */
export function zstdDecompressInto(frame: Uint8Array, out: Uint8Array): number {
  const declared = zstdContentSize(frame.subarray(0, 18));
  if (declared === 'not-zstd') throw new CodecError('the data is not a zstd frame');
  if (declared !== null && declared !== out.length) throw new CodecError(`the zstd frame declares ${declared} bytes; the tensor needs ${out.length}`);
  let decoded: Uint8Array;
  try {
    // The output buffer is out.length bytes: a frame that would expand past it fails in the decoder.
    decoded = zstd.decompress(frame, { defaultHeapSize: Math.max(out.length, 1) });
  } catch (err) {
    throw new CodecError(`the data is not a valid zstd frame of ${out.length} bytes (${(err as Error).message})`);
  }
  if (decoded.length !== out.length) throw new CodecError(`the zstd frame holds ${decoded.length} bytes; the tensor needs ${out.length}`);
  out.set(decoded);
  return decoded.length;
}

/** One zstd frame of `raw` at `level` (the codec's is 1), recording its content size. */
export function zstdCompress(raw: Uint8Array, level = 1): Uint8Array {
  return zstd.compress(raw, level);
}
