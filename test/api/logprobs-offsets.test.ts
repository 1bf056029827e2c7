// text_offset as byte offsets into text, worked out from a choice's text and token strings (as vLLM
// shows them: each token decoded alone, so a part of a character is U+FFFD).
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { ChoiceOffsets, withByteOffsets } from '../../src/api/logprobs-offsets.ts';

const R = '\uFFFD';
const offsets = (text: string, tokens: string[]) => new ChoiceOffsets().next(text, tokens);

test('whole tokens: the byte where each starts', () => {
  assert.equal(offsets('Hello', ['He', 'llo']), [0, 2]);
  assert.equal(offsets('é€😀中', ['é', '€', '😀', '中']), [0, 2, 5, 9]);
});

test('an echoed BOS and a closing EOS take no bytes', () => {
  assert.equal(offsets('ab', ['<|bos|>', 'a', 'b', '<|eos|>']), [0, 0, 1, 2]);
});

test('parts of a character: each U+FFFD takes the bytes that decode to it', () => {
  assert.equal(offsets('😀', [R, R, R, R]), [0, 1, 2, 3]); // one byte per token
  assert.equal(offsets('😀', [R, R + R, R]), [0, 1, 3]); // a lead byte, two continuation bytes, the last
  assert.equal(offsets('a😀b', [`a${R}`, `${R}${R}b`]), [0, 3]); // "a" + 2 bytes, then 2 bytes + "b"
  assert.equal(offsets(': 😀 and', [':', ` ${R}`, R, ' and']), [0, 1, 5, 6]); // GPT-2's split of " 😀": 4 bytes, then 1
  assert.equal(offsets('中文', [R, R, R, R, R, R]), [0, 1, 2, 3, 4, 5]);
});

test('a U+FFFD that is in the text (bytes that were not UTF-8) is its three bytes there', () => {
  assert.equal(offsets(`x${R}y`, ['x', R, 'y']), [0, 1, 4]);
});

test('a stream: offsets count from the start of the whole text; tokens whose text is held back wait for it', () => {
  const s = new ChoiceOffsets();
  assert.equal(s.next('x', ['x']), [0]);
  assert.equal(s.next('', [R]), [1]); // an unfinished character: held back by the engine
  assert.equal(s.next('', [R]), [2]);
  assert.equal(s.next('😀', [R, R]), [3, 4]);
  assert.equal(s.next('y', ['y']), [5]);
  const stop = new ChoiceOffsets(); // "ab" held back as a possible stop string, then released
  assert.equal(stop.next('', ['ab']), [0]);
  assert.equal(stop.next('abd', ['d']), [2]);
});

test('only the numbers of text_offset change; a "text_offset" inside a string is text', () => {
  const body = '{"choices":[{"index":0,"text":"é\\"text_offset\\":[1]x","logprobs":{"text_offset":[0,1,2],"token_logprobs":[-1,-2.0,-9999.0],"tokens":["é","\\"text_offset\\":[1]","x"],"top_logprobs":[]}}]}';
  assert.is(withByteOffsets(body), body.replace('"text_offset":[0,1,2]', '"text_offset":[0,2,19]'));
  assert.is(withByteOffsets('{"choices":[{"index":0,"text":"a","logprobs":null}]}'), '{"choices":[{"index":0,"text":"a","logprobs":null}]}');
  assert.is(withByteOffsets('not json'), 'not json');
});

test('each choice of a body counts from its own text', () => {
  const body = JSON.stringify({ choices: [0, 1].map((index) => ({ index, text: 'éa', logprobs: { text_offset: [0, 1], tokens: ['é', 'a'] } })) });
  assert.equal(JSON.parse(withByteOffsets(body)).choices.map((c: any) => c.logprobs.text_offset), [[0, 2], [0, 2]]);
});

test.run();
