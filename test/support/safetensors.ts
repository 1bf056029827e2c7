/**
 * An independent safetensors reader for tests: the 8-byte little-endian header length, the JSON
 * header, then each tensor's bytes at its offsets, checked to be contiguous, without gaps or overlaps.
 */
const itemSize: Record<string, number> = { BF16: 2, F16: 2, F32: 4, F64: 8, I32: 4, I64: 8, U8: 1 };

export interface ReadTensor {
  dtype: string;
  shape: number[];
  data: Uint8Array;
}

export function readSafetensors(file: Uint8Array): { metadata: Record<string, string>; tensors: Record<string, ReadTensor> } {
  const view = new DataView(file.buffer, file.byteOffset, file.byteLength);
  const headerLength = Number(view.getBigUint64(0, true));
  if (headerLength % 8 !== 0) throw new Error(`header length ${headerLength} is not a multiple of 8`);
  const header = JSON.parse(Buffer.from(file.subarray(8, 8 + headerLength)).toString('utf8'));
  const dataStart = 8 + headerLength;
  const { __metadata__: metadata = {}, ...entries } = header;
  const spans = Object.entries(entries as Record<string, { dtype: string; shape: number[]; data_offsets: [number, number] }>)
    .map(([name, e]) => ({ name, ...e }))
    .sort((a, b) => a.data_offsets[0] - b.data_offsets[0]);
  let next = 0;
  const tensors: Record<string, ReadTensor> = {};
  for (const t of spans) {
    const [begin, end] = t.data_offsets;
    if (begin !== next) throw new Error(`${t.name} begins at ${begin}, not ${next}: a gap or an overlap`);
    const expected = t.shape.reduce((n, d) => n * d, 1) * itemSize[t.dtype];
    if (end - begin !== expected) throw new Error(`${t.name}: ${end - begin} bytes for ${t.dtype} ${JSON.stringify(t.shape)} (${expected} expected)`);
    tensors[t.name] = { dtype: t.dtype, shape: t.shape, data: file.subarray(dataStart + begin, dataStart + end) };
    next = end;
  }
  if (dataStart + next !== file.length) throw new Error(`${file.length - dataStart - next} bytes after the last tensor`);
  return { metadata, tensors };
}
