// The safetensors layout of a harvest shard (ENGINE.md, "Bulk harvest shards"): an 8-byte little-endian
// header length, a UTF-8 JSON header padded with spaces to a multiple of 8, then the tensors' bytes,
// contiguous. Only the header is built here; the bytes are written by whoever holds them.
import { Buffer } from 'node:buffer';

export type SafetensorsDtype = 'BF16' | 'I32' | 'F32' | 'I64' | 'F64';

const ITEM_SIZES: Record<SafetensorsDtype, number> = { BF16: 2, I32: 4, F32: 4, I64: 8, F64: 8 };

/** A tensor to lay out: its bytes are `byteLength` long (checked against dtype × shape). */
export interface TensorSpec {
  name: string;
  dtype: SafetensorsDtype;
  shape: readonly number[];
  byteLength: number;
}

/** A tensor with its place in the data section: [begin, end), relative to the section's start. */
export interface PlacedTensor extends TensorSpec {
  begin: number;
  end: number;
}

/** A shape or an offset never takes more digits than this (Number.MAX_SAFE_INTEGER has 16). */
const WIDEST_NUMBER = Number.MAX_SAFE_INTEGER;
const TENSOR_NAME = /^[A-Za-z0-9_.:-]{1,200}$/;

export class SafetensorsError extends Error {
  override name = 'SafetensorsError';
}

/** Places `specs` one after another from offset 0, in the order given. */
export function layoutTensors(specs: readonly TensorSpec[]): { tensors: PlacedTensor[]; dataBytes: number } {
  let at = 0;
  const tensors = specs.map((spec) => {
    checkSpec(spec);
    const placed = { ...spec, shape: spec.shape.slice(), begin: at, end: at + spec.byteLength };
    at = placed.end;
    return placed;
  });
  return { tensors, dataBytes: at };
}

/**
 * The header's bytes (length prefix included) for `tensors`, which must tile [0, dataBytes) in order with
 * no gap or overlap. The JSON is padded with spaces to a multiple of 8 and, when `room` is given, to exactly
 * `room` bytes in all (a header written ahead of knowing its numbers reserved that much; see `headerRoom`).
 */
export function encodeSafetensorsHeader(tensors: readonly PlacedTensor[], metadata: Readonly<Record<string, string>>, room?: number): Buffer {
  let at = 0;
  for (const t of tensors) {
    checkSpec(t);
    if (t.begin !== at || t.end !== t.begin + t.byteLength) throw new SafetensorsError(`tensor ${t.name} is at [${t.begin}, ${t.end}); the layout needs [${at}, ${at + t.byteLength})`);
    at = t.end;
  }
  for (const [key, value] of Object.entries(metadata)) {
    if (typeof value !== 'string') throw new SafetensorsError(`metadata ${key} must be a string (safetensors metadata holds strings only)`);
  }
  const json = Buffer.from(headerJson(tensors, metadata), 'utf8');
  const padded = roundUp8(json.length);
  const total = room ?? 8 + padded;
  if (total % 8 !== 0) throw new SafetensorsError(`header room ${room} is not a multiple of 8`);
  if (total < 8 + padded) throw new SafetensorsError(`the header needs ${8 + padded} bytes; ${room} were reserved`);
  const header = Buffer.alloc(total, 0x20);
  header.writeBigUInt64LE(BigInt(total - 8), 0);
  json.copy(header, 8);
  return header;
}

/**
 * Bytes to reserve (length prefix included) for the header of these tensors before their shapes and
 * offsets are known: every number is counted at the widest a safe integer can be.
 */
export function headerRoom(tensors: ReadonlyArray<{ name: string; dtype: SafetensorsDtype; rank: number }>, metadata: Readonly<Record<string, string>>): number {
  const widest = tensors.map((t) => ({ name: t.name, dtype: t.dtype, shape: Array<number>(t.rank).fill(WIDEST_NUMBER), begin: WIDEST_NUMBER, end: WIDEST_NUMBER }));
  return 8 + roundUp8(Buffer.byteLength(headerJson(widest, metadata), 'utf8'));
}

function headerJson(tensors: ReadonlyArray<Pick<PlacedTensor, 'name' | 'dtype' | 'shape' | 'begin' | 'end'>>, metadata: Readonly<Record<string, string>>): string {
  // Built member by member so that the order is the data's order (an object would reorder numeric-looking keys).
  const members = [`"__metadata__":${JSON.stringify(metadata)}`];
  for (const t of tensors) members.push(`${JSON.stringify(t.name)}:{"dtype":"${t.dtype}","shape":[${t.shape.join(',')}],"data_offsets":[${t.begin},${t.end}]}`);
  return `{${members.join(',')}}`;
}

function checkSpec(spec: TensorSpec): void {
  if (!TENSOR_NAME.test(spec.name) || spec.name === '__metadata__') throw new SafetensorsError(`tensor name ${JSON.stringify(spec.name)} is not allowed`);
  const size = ITEM_SIZES[spec.dtype];
  if (size === undefined) throw new SafetensorsError(`tensor ${spec.name}: dtype ${spec.dtype} is not one a harvest file holds`);
  let bytes = size;
  for (const d of spec.shape) {
    if (!Number.isSafeInteger(d) || d < 0) throw new SafetensorsError(`tensor ${spec.name}: shape [${spec.shape.join(', ')}] is not a list of non-negative integers`);
    bytes *= d;
  }
  if (bytes !== spec.byteLength) throw new SafetensorsError(`tensor ${spec.name}: shape [${spec.shape.join(', ')}] of ${spec.dtype} holds ${bytes} bytes, not ${spec.byteLength}`);
}

function roundUp8(n: number): number {
  return Math.ceil(n / 8) * 8;
}

/** A whole small safetensors file (header and data) from its tensors, laid out in the order given. */
export function encodeSafetensors(tensors: ReadonlyArray<{ name: string; dtype: SafetensorsDtype; shape: readonly number[]; bytes: Uint8Array }>, metadata: Readonly<Record<string, string>>): Buffer {
  const { tensors: placed, dataBytes } = layoutTensors(tensors.map((t) => ({ name: t.name, dtype: t.dtype, shape: t.shape, byteLength: t.bytes.byteLength })));
  const header = encodeSafetensorsHeader(placed, metadata);
  const out = Buffer.alloc(header.length + dataBytes);
  header.copy(out, 0);
  tensors.forEach((t, i) => out.set(t.bytes, header.length + placed[i].begin));
  return out;
}

export interface ReadTensor {
  dtype: string;
  shape: number[];
  /** A copy of the tensor's bytes, at offset 0 of its own memory (so typed views of it are aligned). */
  bytes: Uint8Array;
}

/** Parses a whole safetensors file held in memory: its metadata and tensors. Throws SafetensorsError when malformed. */
export function decodeSafetensors(file: Uint8Array): { metadata: Record<string, string>; tensors: Map<string, ReadTensor> } {
  const buf = Buffer.from(file.buffer, file.byteOffset, file.byteLength);
  if (buf.length < 8) throw new SafetensorsError('the file is shorter than its header length');
  const headerLength = Number(buf.readBigUInt64LE(0));
  if (headerLength > buf.length - 8) throw new SafetensorsError(`the header says ${headerLength} bytes; the file holds ${buf.length - 8} after its length`);
  let header: Record<string, unknown>;
  try {
    header = JSON.parse(buf.subarray(8, 8 + headerLength).toString('utf8'));
  } catch {
    throw new SafetensorsError('the header is not JSON');
  }
  const dataStart = 8 + headerLength;
  const metadata = (header.__metadata__ ?? {}) as Record<string, string>;
  const tensors = new Map<string, ReadTensor>();
  for (const [name, value] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    const t = value as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    const offsets = t.data_offsets as number[];
    if (typeof t.dtype !== 'string' || !Array.isArray(t.shape) || !Array.isArray(offsets) || offsets.length !== 2) throw new SafetensorsError(`tensor ${name} is malformed`);
    const [begin, end] = offsets;
    if (!Number.isSafeInteger(begin) || !Number.isSafeInteger(end) || begin < 0 || end < begin || dataStart + end > buf.length) throw new SafetensorsError(`tensor ${name} lies outside the file`);
    tensors.set(name, { dtype: t.dtype, shape: (t.shape as number[]).slice(), bytes: Uint8Array.prototype.slice.call(buf, dataStart + begin, dataStart + end) });
  }
  return { metadata, tensors };
}
