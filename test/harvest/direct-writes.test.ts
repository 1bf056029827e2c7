import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Buffer } from 'node:buffer';
import { createHash, randomFillSync } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DirectWriter, directRuns, rangeOf } from '../../src/harvest/direct-writes.ts';
import { CaptureBuffers } from '../../src/harvest/capture-decode.ts';
import { fileHarvestStorage } from '../../src/harvest/storage.ts';
import { hashFile } from '../../src/harvest/file-hasher.ts';
import { Prng } from '../../src/reference-engine/prng.ts';

const roots = [mkdtempSync(join(tmpdir(), 'svc-direct-')), ...(existsSync('/dev/shm') ? [mkdtempSync('/dev/shm/svc-direct-')] : [])];

/** A seeded generator in [0, 1): the same inputs every run. */
const random = (seed: number): (() => number) => {
  const prng = new Prng(seed);
  return () => prng.next();
};

test('the file system of the tests takes O_DIRECT (so the direct path is what the tests below run)', async () => {
  const path = join(roots[0], 'probe');
  writeFileSync(path, '');
  const writer = await DirectWriter.open(path);
  assert.ok(writer !== null, `${roots[0]} takes O_DIRECT`);
  await writer!.close();
});

test('a shard written as the pipeline writes it (room, unaligned batches of many pieces, the header last): the same bytes and sha256, direct or not', async () => {
  const next = random(5);
  for (const root of roots) {
    const storage = fileHarvestStorage(root);
    for (let round = 0; round < 3; round++) {
      const room = 8 + Math.floor(next() * 9000);
      const expected: Buffer[] = [Buffer.alloc(room, 0x20)];
      const sink = await storage.createShard('hj_direct', `shard-0000${round}-claim.safetensors`);
      let at = room;
      for (let batch = 0; batch < 3; batch++) {
        // captures of odd sizes (a few MB) with token ids between them
        const chunks = Array.from({ length: 2 + Math.floor(next() * 3) }, (_, i) => {
          const size = i % 2 === 0 ? 1_000_000 + Math.floor(next() * 3_000_000) : 4 * (1 + Math.floor(next() * 700));
          return randomFillSync(Buffer.allocUnsafe(size));
        });
        await sink.write(at, chunks);
        expected.push(...chunks);
        at += chunks.reduce((n, c) => n + c.length, 0);
      }
      const header = Buffer.alloc(room, 0x20);
      header.write(`{"round":${round}}`, 8);
      await sink.write(0, [header]);
      expected[0] = header;
      const stored = await sink.commit();
      const bytes = Buffer.concat(expected);
      const file = readFileSync(join(root, 'hj_direct', `shard-0000${round}-claim.safetensors`));
      assert.is(file.length, bytes.length, `${root}, round ${round}: length`);
      assert.ok(file.equals(bytes), `${root}, round ${round}: the bytes`);
      assert.is(stored.sha256, createHash('sha256').update(bytes).digest('hex'));
      assert.is(stored.bytes, bytes.length);
      // read around the page cache or through it: the same hash
      const path = join(root, 'hj_direct', `shard-0000${round}-claim.safetensors`);
      assert.is(await hashFile(path, bytes.length, true), stored.sha256);
      assert.is(await hashFile(path, bytes.length, false), stored.sha256);
    }
  }
});

test('captures in kernel memory placed as their file offsets are written from their own memory, misplaced ones staged: the same bytes either way', async () => {
  const next = random(9);
  const buffers = new CaptureBuffers({ keep: 8 });
  for (const root of roots) {
    const storage = fileHarvestStorage(root);
    for (const placed of [true, false]) {
      const room = 8 * (1 + Math.floor(next() * 1200));
      const file = `shard-0000${placed ? 1 : 2}-claim.safetensors`;
      const sink = await storage.createShard('hj_placed', file);
      const expected: Buffer[] = [Buffer.alloc(room, 0x20)];
      const taken: Buffer[] = [];
      let at = room;
      for (let batch = 0; batch < 2; batch++) {
        const chunks: Buffer[] = [];
        let offset = at;
        for (let k = 0; k < 2; k++) {
          const size = 4 * (300_000 + Math.floor(next() * 500_000));
          const capture = randomFillSync(buffers.take(size, placed ? offset : offset + 8));
          const ids = randomFillSync(Buffer.allocUnsafe(4 * (1 + Math.floor(next() * 900))));
          chunks.push(capture, ids);
          taken.push(capture);
          offset += size + ids.length;
        }
        const length = offset - at;
        const span = DirectWriter.span(at, length)!;
        const runs = directRuns(at, chunks, span.from, span.to);
        const fromCaptures = runs.filter((r) => r.bytes !== null);
        assert.is(fromCaptures.length, placed ? 2 : 0, `placed ${placed}: runs written from the captures' memory`);
        for (const r of fromCaptures) assert.ok(chunks.some((c) => c.buffer === r.bytes!.buffer), 'a view of a capture, no copy');
        assert.is(runs[0].from, span.from);
        runs.forEach((r, i) => assert.is(r.from, i === 0 ? span.from : runs[i - 1].to, 'the runs tile the span'));
        assert.is(runs.at(-1)!.to, span.to);
        await sink.write(at, chunks);
        expected.push(...chunks.map((c) => Buffer.from(c)));
        at = offset;
      }
      await sink.write(0, [Buffer.alloc(room, 0x20)]);
      const stored = await sink.commit();
      const bytes = Buffer.concat(expected);
      const path = join(root, 'hj_placed', file);
      assert.ok(readFileSync(path).equals(bytes), `${root}, placed ${placed}: the bytes`);
      assert.is(stored.sha256, createHash('sha256').update(bytes).digest('hex'));
      for (const c of taken) buffers.give(c);
    }
  }
});

test('rangeOf: bytes [from, to) of chunks laid end to end', () => {
  const chunks = [Buffer.from('abc'), Buffer.from(''), Buffer.from('defgh'), Buffer.from('ij')];
  const text = (from: number, to: number) => Buffer.concat(rangeOf(chunks, from, to)).toString();
  assert.is(text(0, 10), 'abcdefghij');
  assert.is(text(2, 4), 'cd');
  assert.is(text(3, 8), 'defgh');
  assert.is(text(9, 10), 'j');
  assert.is(text(5, 5), '');
});

test.after(() => {
  for (const root of roots) rmSync(root, { recursive: true, force: true });
});

test.run();
