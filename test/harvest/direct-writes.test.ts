import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Buffer } from 'node:buffer';
import { createHash, randomFillSync } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DirectWriter, rangeOf } from '../../src/harvest/direct-writes.ts';
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
