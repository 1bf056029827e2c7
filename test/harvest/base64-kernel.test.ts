import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { Buffer } from 'node:buffer';
import { Base64Decoder, CodecError } from '../../src/codec/index.ts';
import { wasmBase64Into } from '../../src/harvest/base64-kernel.ts';
import { CaptureBuffers, decodeCapture } from '../../src/harvest/capture-decode.ts';
import { KernelMemory, kernelMemoryOf } from '../../src/harvest/stats-memory.ts';
import { Prng } from '../../src/reference-engine/prng.ts';

const km = new KernelMemory(4 << 20);
const region = km.alloc(2 << 20)!;
const dest = Buffer.from(km.buffer, region, 2 << 20);
const fast = wasmBase64Into(km)!;
/** Characters the WebAssembly decoder decoded, over the runs since last read. */
let fastChars = 0;
const counted = (text: Uint8Array, to: Uint8Array, at: number) => {
  const done = fast(text, to, at);
  fastChars += done;
  return done;
};

/** A seeded generator in [0, 1): the same inputs every run. */
const random = (seed: number): (() => number) => {
  const prng = new Prng(seed);
  return () => prng.next();
};

/**
 * The outcome of decoding `text` in `pieces` (sizes, repeated) into `room` bytes: the bytes, or the error
 * thrown. `run`: each piece's run of the alphabet through `run`, the rest through `write` (as the codec scanner hands a capture's text over).
 */
function outcome(text: Buffer, pieces: number[], room: number, withFast: boolean, run = false): { bytes: Buffer } | { error: string } {
  dest.fill(0xa5, 0, room);
  const decoder = new Base64Decoder(dest.subarray(0, room), 0, withFast ? counted : null);
  try {
    for (let at = 0, p = 0; at < text.length; p++) {
      const size = pieces[p % pieces.length];
      const piece = text.subarray(at, at + size);
      decoder.write(piece.subarray(run ? decoder.run(piece, 0, piece.length) : 0));
      at += size;
    }
    return { bytes: Buffer.from(dest.subarray(0, decoder.end())) };
  } catch (err) {
    assert.instance(err, CodecError);
    return { error: (err as Error).message };
  }
}

/** The WebAssembly decoder and the exact one agree on `text`: the same bytes, or both refuse it. */
function agree(text: Buffer, pieces: number[], what: string, room = 3 * Math.ceil(text.length / 4)): 'decoded' | 'refused' {
  const exact = outcome(text, pieces, room, false);
  for (const [quick, how] of [[outcome(text, pieces, room, true), 'fast'], [outcome(text, pieces, room, true, true), 'in runs'], [outcome(text, pieces, room, false, true), 'in runs, no WebAssembly']] as const) {
    assert.equal('error' in quick, 'error' in exact, `${what}: ${JSON.stringify('error' in exact ? exact : 'decoded')} exactly, ${JSON.stringify('error' in quick ? quick : 'decoded')} ${how}`);
    if ('bytes' in exact && 'bytes' in quick) assert.ok(quick.bytes.equals(exact.bytes), `${what}: the same bytes ${how}`);
  }
  return 'bytes' in exact ? 'decoded' : 'refused';
}

function randomBytes(next: () => number, n: number): Buffer {
  return Buffer.from(Array.from({ length: n }, () => Math.floor(next() * 256)));
}

test('valid text decodes to what Node decodes, in pieces of any size, the WebAssembly decoder doing the bulk', () => {
  const next = random(7);
  fastChars = 0;
  let total = 0;
  for (let round = 0; round < 60; round++) {
    const raw = randomBytes(next, Math.floor(next() * 3000) + (round % 3));
    const text = Buffer.from(raw.toString('base64'));
    const pieces = [Math.floor(next() * 700) + 1, Math.floor(next() * 70) + 1, 65536];
    assert.is(agree(text, pieces, `round ${round}`), 'decoded');
    const got = outcome(text, pieces, raw.length, true);
    assert.ok('bytes' in got && got.bytes.equals(raw), `round ${round}: Node's bytes`);
    total += text.length;
  }
  // Counted over three fast runs per round; pieces under 64 characters go the exact way.
  assert.ok(fastChars > total, `${fastChars} of ${2 * total} characters decoded by the WebAssembly decoder`);
  // A capture decoded into the pool's kernel memory takes the same path: the bytes Node decodes.
  const raw = randomBytes(next, 2 * 3 * 64 * 2);
  const body = Buffer.from(`{"activations":{"residual_stream":{"data":"${raw.toString('base64')}","dtype":"int16","original_dtype":"torch.bfloat16","shape":[2,3,64]}}}`);
  const decoded = decodeCapture(body, { layers: 2, dModel: 64 }, new CaptureBuffers({ minBytes: 0 }));
  assert.ok(decoded.bytes.equals(raw));
});

test('every byte value at every position of a block: accepted or refused exactly as the exact decoder does', () => {
  const next = random(11);
  const raw = randomBytes(next, 3 * 48);
  const base = Buffer.from(raw.toString('base64')); // 192 characters, no padding
  const accepted = new Set<number>();
  for (let value = 0; value < 256; value++) {
    for (const at of [0, 5, 17, 63, 64, 100, 127, 130, 191]) {
      const text = Buffer.from(base);
      text[at] = value;
      for (const pieces of [[192], [64], [3, 61]]) {
        if (agree(text, pieces, `byte ${value} at ${at}, pieces ${pieces}`) === 'decoded' && at === 17) accepted.add(value);
      }
    }
  }
  // The standard alphabet and the URL-safe one (Node's decoder takes both); nothing else.
  const alphabet = new Set([...'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/-_'].map((c) => c.charCodeAt(0)));
  assert.equal([...accepted].sort((a, b) => a - b), [...alphabet].sort((a, b) => a - b));
});

test('padding: at the end only, one or two, split across pieces; misplaced, doubled or followed by text is refused as before', () => {
  const next = random(23);
  for (let round = 0; round < 200; round++) {
    const raw = randomBytes(next, 64 + Math.floor(next() * 200));
    const text = Buffer.from(raw.toString('base64'));
    const pieces = [[text.length], [64], [Math.floor(next() * 90) + 1], [1, 63, 65]][round % 4];
    assert.is(agree(text, pieces, `padded text, round ${round}`), 'decoded');
    // an '=' anywhere, or two, or the text going on after the padding
    const broken = Buffer.from(text);
    broken[Math.floor(next() * text.length)] = 0x3d;
    if (round % 3 === 0) broken[Math.floor(next() * text.length)] = 0x3d;
    agree(broken, pieces, `'=' placed at random, round ${round}`);
    agree(Buffer.concat([text, Buffer.from('QUFB')]), pieces, `text after the padding, round ${round}`);
    agree(text.subarray(0, text.length - 1 - (round % 3)), pieces, `cut short, round ${round}`);
    // too little room
    agree(text, pieces, `room short, round ${round}`, raw.length - 1);
  }
});

test('random bytes, and random runs of the alphabet with stray characters: the same outcome as the exact decoder', () => {
  const next = random(31);
  const alphabet = Buffer.from('ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/');
  const strays = Buffer.from('=-_ \n\r\t"\\.:\x00\x7f\x80\xff');
  let refused = 0;
  for (let round = 0; round < 300; round++) {
    const n = 4 * Math.floor(next() * 100);
    const text = round % 5 === 0 ? randomBytes(next, n) : Buffer.from(Array.from({ length: n }, () => alphabet[Math.floor(next() * 64)]));
    for (let k = Math.floor(next() * 3); k > 0 && n > 0; k--) text[Math.floor(next() * n)] = strays[Math.floor(next() * strays.length)];
    if (agree(text, [Math.floor(next() * 130) + 1], `round ${round}`) === 'refused') refused++;
  }
  assert.ok(refused > 50, `${refused} refused`);
});

test('the WebAssembly decoder stops where the 16-character block holding the first stray character begins, every block before it decoded', () => {
  const next = random(41);
  const raw = randomBytes(next, 3 * 80);
  const base = Buffer.from(raw.toString('base64')); // 320 characters
  for (let at = 0; at < base.length; at++) {
    for (const stray of [0x22, 0x3d, 0x2d, 0x0a, 0x80]) {
      const text = Buffer.from(base);
      text[at] = stray;
      dest.fill(0xa5, 0, 256);
      const done = fast(text, dest, 0);
      assert.is(done, at - (at % 16), `stray ${stray} at ${at}`);
      assert.ok(dest.subarray(0, (done / 4) * 3).equals(raw.subarray(0, (done / 4) * 3)), `the bytes before ${at}`);
      assert.is(dest[(done / 4) * 3], 0xa5, `nothing stored for the block of ${at}`);
    }
  }
});

test('a capture split into two chunks at every point decodes to the same bytes, the bulk of its text by the WebAssembly decoder', () => {
  const next = random(43);
  const raw = randomBytes(next, 2 * 5 * 64 * 2);
  const body = Buffer.from(`{"activations":{"residual_stream":{"data":"${raw.toString('base64')}","dtype":"int16","original_dtype":"torch.bfloat16","shape":[2,5,64]}}}`);
  const pool = new CaptureBuffers({ minBytes: 0 });
  const whole = decodeCapture(body, { layers: 2, dModel: 64 }, pool);
  assert.ok(whole.bytes.equals(raw));
  pool.give(whole.bytes);
  for (let cut = 1; cut < body.length; cut++) {
    const got = decodeCapture([body.subarray(0, cut), body.subarray(cut)], { layers: 2, dModel: 64 }, pool);
    assert.ok(got.bytes.equals(raw), `cut at ${cut}`);
    pool.give(got.bytes);
  }
  // The run stops at the padding, the text before it decoded, the bulk by the WebAssembly decoder.
  const text = Buffer.from(`${raw.toString('base64')}"`);
  const padding = text.indexOf(0x3d);
  assert.ok(padding > 0);
  fastChars = 0;
  const decoder = new Base64Decoder(dest.subarray(0, raw.length), 0, counted);
  assert.is(decoder.run(text, 0, text.length), padding);
  assert.ok(fastChars >= padding - 64, `${fastChars} of ${padding} characters by the WebAssembly decoder`);
  decoder.write(text.subarray(padding, text.length - 1));
  assert.ok(dest.subarray(0, decoder.end()).equals(raw));
});

test.run();
