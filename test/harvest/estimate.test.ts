// The harvest token estimate counts code points, as [...text].length would, without building an array.
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { codePoints, estimateTokens } from '../../src/harvest/estimate.ts';

const it = suite('harvest token estimate');

it('a surrogate pair is one character; a lone surrogate is one too, wherever it stands', () => {
  for (const text of ['', 'a', 'plain ascii', 'é€', '🙂', 'a🙂b', '🙂🙂', '\ud83d', '\ude42', 'x\ud83d', '\ude42\ud83d', '\ud83d\ud83d\ude42', '𝔘𝔫𝔦𝔠𝔬𝔡𝔢 text']) {
    assert.is(codePoints(text), [...text].length, JSON.stringify(text));
  }
});

it('characters over all prompts, divided by 4 and rounded up', () => {
  assert.is(estimateTokens(['🙂'.repeat(8_000)]), 2_000);
  assert.is(estimateTokens(['🙂'.repeat(4_000), '🙂'.repeat(4_001)]), 2_001);
  assert.is(estimateTokens(['abc', 'de']), 2);
});

it.run();
