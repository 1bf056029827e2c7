// Where a harvest's files live: `<root>/<jobId>/` holds the job's input (its prompts, until the job is
// tidied), its shards and, once it finished whole, manifest.json. Every file appears whole or not at all:
// it is written under a hidden temporary name, fsynced, renamed, and the directory fsynced.
import { Buffer } from 'node:buffer';
import { createHash, randomBytes } from 'node:crypto';
import { mkdir, open, readdir, readFile, rename, rm, unlink, type FileHandle } from 'node:fs/promises';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { parseManifest, serializeManifest, type HarvestManifest } from './manifest.ts';
import { hashFile } from './file-hasher.ts';
import { DirectWriter, rangeOf, skipBytes } from './direct-writes.ts';

/** A file as stored: its size and the sha256 of its bytes (hex). */
export interface StoredFile {
  sha256: string;
  bytes: number;
}

/**
 * A shard being written under a temporary name. Writes are positional (the pipeline writes tensors as
 * they arrive and the header last, in the room it reserved); `commit` fsyncs, hashes and renames.
 */
export interface ShardSink {
  readonly file: string;
  /** Writes `chunks` one after another from byte `position` of the file. */
  write(position: number, chunks: readonly Uint8Array[]): Promise<void>;
  /**
   * Publishes the file under its name: fsync, sha256 of its bytes as written, rename, fsync of the
   * directory. The written ranges must tile the file from byte 0 without a gap or an overlap.
   */
  commit(): Promise<StoredFile>;
  /** Closes and removes the temporary file; nothing of the shard is left. */
  abort(): Promise<void>;
}

export interface HarvestStorage {
  readonly root: string;
  /** Stores a job's prompts (atomically); the hash is of the stored bytes. */
  saveInput(jobId: string, prompts: readonly string[]): Promise<StoredFile>;
  /** The prompts saveInput stored; throws (ENOENT) once the job's input is gone. */
  loadInput(jobId: string): Promise<string[]>;
  /** Starts a shard file named `file` (`*.safetensors`) in the job's folder. */
  createShard(jobId: string, file: string): Promise<ShardSink>;
  /** A shard (or manifest.json) to send: its size and a stream of its bytes; null when absent. */
  openShard(jobId: string, file: string): Promise<{ size: number; stream: Readable } | null>;
  /**
   * Writes a small file of the job whole (atomically): a shard's running-statistics checkpoint
   * (`*.stats`) or the job's `stats.safetensors`. Returns its size and sha256.
   */
  writeFile(jobId: string, file: string, bytes: Uint8Array): Promise<StoredFile>;
  /** A checkpoint or stats file writeFile stored; null when absent. */
  readFile(jobId: string, file: string): Promise<Buffer | null>;
  /** `length` bytes of a stored shard from byte `position` (the statistics of a job resumed without a checkpoint). */
  readRange(jobId: string, file: string, position: number, length: number): Promise<Buffer>;
  /** Removes one checkpoint file (absent: nothing happens). */
  removeFile(jobId: string, file: string): Promise<void>;
  /** Writes manifest.json (atomically): call it once every shard is recorded. */
  writeManifest(jobId: string, manifest: HarvestManifest): Promise<StoredFile>;
  /** The stored manifest, with the size and sha256 of its bytes; null when there is none yet. */
  readManifest(jobId: string): Promise<StoredManifest | null>;
  /** The names in the job's folder, temporary files included (none when the folder is absent). */
  listFiles(jobId: string): Promise<string[]>;
  /** Removes the input and every file but `keepFiles`, manifest.json and stats.safetensors (temporary ones too); returns what it removed. */
  tidy(jobId: string, keepFiles: readonly string[]): Promise<string[]>;
  /** Removes the job's folder and everything in it. */
  removeJob(jobId: string): Promise<void>;
  /** The jobs that have a folder (files) here. */
  listJobs(): Promise<string[]>;
}

/** Whether an error (or one it wraps) is the file system saying it has no space (or quota) left. */
export function isStorageFull(error: unknown): boolean {
  for (let e = error as { code?: unknown; cause?: unknown } | null | undefined, depth = 0; e && depth < 8; e = e.cause as typeof e, depth++) {
    if (e.code === 'ENOSPC' || e.code === 'EDQUOT') return true;
  }
  return false;
}

export interface StoredManifest extends StoredFile {
  manifest: HarvestManifest;
}

export class HarvestStorageError extends Error {
  override name = 'HarvestStorageError';
}

export const INPUT_FILE = 'input.json';
export const MANIFEST_FILE = 'manifest.json';
export const STATS_FILE = 'stats.safetensors';

// Job ids are `hj_` + base32 in practice; anything that could leave the folder is refused.
const JOB_ID = /^[A-Za-z0-9][A-Za-z0-9_-]{0,127}$/;
// File names: no separator, no leading dot (temporary names start with one), so never `.` or `..`.
const FILE_NAME = /^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$/;
const SHARD_FILE = /\.safetensors$/;
const CHECKPOINT_FILE = /\.stats$/;
const writable = (file: string) => CHECKPOINT_FILE.test(file) || file === STATS_FILE;
// Prompts, and activations derived from them, are readable by the service's user only.
const FILE_MODE = 0o600;
const DIR_MODE = 0o700;

/**
 * The name of shard `shard` written under claim `claimId`: `shard-00007-<claim suffix>.safetensors`. A
 * claim writes names no other claim writes, so a superseded worker never replaces a recorded shard.
 */
export function shardFileName(shard: number, claimId: string): string {
  if (!Number.isSafeInteger(shard) || shard < 0) throw new HarvestStorageError(`shard ${shard} is not a shard number`);
  return `shard-${String(shard).padStart(5, '0')}-${claimTag(claimId)}.safetensors`;
}

/** A claim id's last 12 letters and digits, lowercased: how shard files and batch request ids name the claim. */
export function claimTag(claimId: string): string {
  const suffix = claimId.replace(/[^A-Za-z0-9]/g, '').slice(-12).toLowerCase();
  if (suffix.length === 0) throw new HarvestStorageError('the claim id holds no letter or digit to name its shards by');
  return suffix;
}

export function fileHarvestStorage(root: string): HarvestStorage {
  const jobDir = (jobId: string) => {
    if (!JOB_ID.test(jobId)) throw new HarvestStorageError(`job id ${JSON.stringify(jobId)} is not allowed in a path`);
    return join(root, jobId);
  };
  const filePath = (jobId: string, file: string) => {
    if (!FILE_NAME.test(file)) throw new HarvestStorageError(`file name ${JSON.stringify(file)} is not allowed`);
    return join(jobDir(jobId), file);
  };
  const ensureDir = async (jobId: string) => {
    const dir = jobDir(jobId);
    await mkdir(dir, { recursive: true, mode: DIR_MODE });
    return dir;
  };

  return {
    root,

    async saveInput(jobId, prompts) {
      if (!Array.isArray(prompts) || !prompts.every((p) => typeof p === 'string')) throw new HarvestStorageError('the input is a list of prompt strings');
      const bytes = Buffer.from(JSON.stringify(prompts), 'utf8');
      await writeWhole(await ensureDir(jobId), INPUT_FILE, bytes);
      return { sha256: sha256(bytes), bytes: bytes.length };
    },

    async loadInput(jobId) {
      const prompts: unknown = JSON.parse(await readFile(filePath(jobId, INPUT_FILE), 'utf8'));
      if (!Array.isArray(prompts) || !prompts.every((p) => typeof p === 'string')) throw new HarvestStorageError(`the input of ${jobId} is not a list of prompts`);
      return prompts;
    },

    async createShard(jobId, file) {
      filePath(jobId, file);
      if (!SHARD_FILE.test(file)) throw new HarvestStorageError(`a shard file is named *.safetensors, not ${JSON.stringify(file)}`);
      return openSink(await ensureDir(jobId), file);
    },

    async openShard(jobId, file) {
      if (!SHARD_FILE.test(file) && file !== MANIFEST_FILE) throw new HarvestStorageError(`only shards, the statistics and the manifest are sent, not ${JSON.stringify(file)}`);
      let handle: FileHandle;
      try {
        handle = await open(filePath(jobId, file), 'r');
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
        throw err;
      }
      try {
        const { size } = await handle.stat();
        return { size, stream: handle.createReadStream({ start: 0, end: Math.max(0, size - 1), autoClose: true }) };
      } catch (err) {
        await handle.close();
        throw err;
      }
    },

    async writeFile(jobId, file, bytes) {
      filePath(jobId, file);
      if (!writable(file)) throw new HarvestStorageError(`only checkpoints (*.stats) and ${STATS_FILE} are written whole, not ${JSON.stringify(file)}`);
      await writeWhole(await ensureDir(jobId), file, bytes);
      return { sha256: sha256(bytes), bytes: bytes.byteLength };
    },

    async readFile(jobId, file) {
      if (!writable(file)) throw new HarvestStorageError(`only checkpoints (*.stats) and ${STATS_FILE} are read whole, not ${JSON.stringify(file)}`);
      try {
        return await readFile(filePath(jobId, file));
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
        throw err;
      }
    },

    async readRange(jobId, file, position, length) {
      if (!SHARD_FILE.test(file)) throw new HarvestStorageError(`only shards are read in ranges, not ${JSON.stringify(file)}`);
      const handle = await open(filePath(jobId, file), 'r');
      try {
        const out = Buffer.allocUnsafeSlow(length);
        for (let at = 0; at < length; ) {
          const { bytesRead } = await handle.read(out, at, length - at, position + at);
          if (bytesRead === 0) throw new HarvestStorageError(`${file} ends before byte ${position + length}`);
          at += bytesRead;
        }
        return out;
      } finally {
        await handle.close();
      }
    },

    async removeFile(jobId, file) {
      if (!CHECKPOINT_FILE.test(file)) throw new HarvestStorageError(`only checkpoints are removed one by one, not ${JSON.stringify(file)}`);
      await rm(filePath(jobId, file), { force: true });
    },

    async writeManifest(jobId, manifest) {
      const bytes = serializeManifest(manifest);
      await writeWhole(await ensureDir(jobId), MANIFEST_FILE, bytes);
      return { sha256: sha256(bytes), bytes: bytes.length };
    },

    async readManifest(jobId) {
      let bytes: Buffer;
      try {
        bytes = await readFile(filePath(jobId, MANIFEST_FILE));
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
        throw err;
      }
      return { manifest: parseManifest(bytes.toString('utf8')), sha256: sha256(bytes), bytes: bytes.length };
    },

    async listFiles(jobId) {
      try {
        return (await readdir(jobDir(jobId))).sort();
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
        throw err;
      }
    },

    async tidy(jobId, keepFiles) {
      const keep = new Set([...keepFiles, MANIFEST_FILE, STATS_FILE]);
      const removed: string[] = [];
      for (const name of await this.listFiles(jobId)) {
        if (keep.has(name)) continue;
        await rm(join(jobDir(jobId), name), { force: true, recursive: true });
        removed.push(name);
      }
      if (removed.length > 0) await syncDir(jobDir(jobId));
      return removed;
    },

    async removeJob(jobId) {
      await rm(jobDir(jobId), { recursive: true, force: true });
    },

    async listJobs() {
      try {
        return (await readdir(root)).filter((name) => JOB_ID.test(name));
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
        throw err;
      }
    },
  };
}

function sha256(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

function temporaryName(file: string): string {
  return `.${file}.${randomBytes(6).toString('hex')}.partial`;
}

/** Writes a small file whole: temporary name, fsync, rename, directory fsync. */
async function writeWhole(dir: string, file: string, bytes: Uint8Array): Promise<void> {
  const temp = join(dir, temporaryName(file));
  const handle = await open(temp, 'wx', FILE_MODE);
  try {
    await handle.writeFile(bytes);
    await handle.sync();
    await handle.close();
    await rename(temp, join(dir, file));
  } catch (err) {
    await handle.close().catch(() => {});
    await unlink(temp).catch(() => {});
    throw err;
  }
  await syncDir(dir);
}

/** Makes a rename in `dir` durable. */
async function syncDir(dir: string): Promise<void> {
  const handle = await open(dir, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

async function openSink(dir: string, file: string): Promise<ShardSink> {
  const temp = join(dir, temporaryName(file));
  const handle = await open(temp, 'wx+', FILE_MODE); // read too: commit hashes what was written
  let end = 0; // the file's length so far
  let written = 0; // bytes written: equal to `end` when the writes tiled the file
  let state: 'open' | 'committed' | 'aborted' = 'open';
  const direct = await DirectWriter.open(temp);
  // writev writes the pieces in one call; it may write less than asked, so the rest is sent again.
  const writeBuffered = async (chunks: readonly Uint8Array[], position: number) => {
    let at = position;
    let rest = chunks.filter((c) => c.byteLength > 0);
    while (rest.length > 0) {
      const { bytesWritten } = await handle.writev(rest, at);
      at += bytesWritten;
      rest = skipBytes(rest, bytesWritten);
    }
  };
  // Writeback started after each write, in the background: the disk works while the next captures are
  // decoded, instead of idling until the commit's fsync (the kernel starts on its own only past
  // dirty_background_ratio, gigabytes). One at a time; its failure surfaces at the next call.
  let flushing: Promise<unknown> | null = null;
  let flushError: unknown = null;
  const flushInBackground = () => {
    if (flushing !== null) return;
    flushing = handle.datasync().then(
      () => (flushing = null),
      (err) => {
        flushError ??= err;
        flushing = null;
      },
    );
  };
  const settleFlush = async () => {
    if (flushing !== null) await flushing;
    if (flushError !== null) throw flushError;
  };
  const ensureOpen = () => {
    if (state !== 'open') throw new HarvestStorageError(`the shard ${file} is already ${state}`);
  };
  return {
    file,

    async write(position, chunks) {
      ensureOpen();
      let length = 0;
      for (const c of chunks) length += c.byteLength;
      const span = direct === null ? null : DirectWriter.span(position, length);
      if (span === null) await writeBuffered(chunks, position);
      else {
        // the whole blocks around the page cache, the edges through it
        await writeBuffered(rangeOf(chunks, 0, span.from - position), position);
        try {
          await direct!.write(position, chunks, span.from, span.to);
        } catch (err) {
          if ((err as NodeJS.ErrnoException).code !== 'EINVAL') throw err;
          await writeBuffered(rangeOf(chunks, span.from - position, span.to - position), span.from);
        }
        await writeBuffered(rangeOf(chunks, span.to - position, length), span.to);
      }
      written += length;
      end = Math.max(end, position + length);
      if (flushError !== null) throw flushError;
      flushInBackground();
    },

    async commit() {
      ensureOpen();
      if (written !== end) throw new HarvestStorageError(`the shard ${file} was written with gaps or overlaps (${written} bytes written over ${end})`);
      state = 'committed';
      let sha256: string;
      try {
        await settleFlush();
        // The hash reads the bytes back (from the page cache), in its own thread, while the fsync runs:
        // the header is written last, so the file's bytes were never written in order to hash on the way.
        [, sha256] = await Promise.all([handle.sync(), hashFile(temp, end, direct !== null)]);
        await direct?.close();
        await handle.close();
        await rename(temp, join(dir, file));
      } catch (err) {
        await direct?.close().catch(() => {});
        await handle.close().catch(() => {});
        await unlink(temp).catch(() => {});
        throw err;
      }
      await syncDir(dir);
      return { sha256, bytes: end };
    },

    async abort() {
      if (state !== 'open') return;
      state = 'aborted';
      await flushing;
      await direct?.close().catch(() => {});
      await handle.close().catch(() => {});
      await unlink(temp).catch((err: NodeJS.ErrnoException) => {
        if (err.code !== 'ENOENT') throw err;
      });
    },
  };
}
