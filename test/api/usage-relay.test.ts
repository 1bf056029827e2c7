/**
 * SseUsageRelay's counts: content frames received from the engine (`contentFrames`, what a stream cut
 * short is billed) and content frames the client's socket took (`relayedFrames`: those of the writes
 * whose callback came back without an error). A sink whose write callbacks the test calls stands in
 * for the response's socket.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { Writable } from 'node:stream';
import { setImmediate as tick } from 'node:timers/promises';
import { SseUsageRelay } from '../../src/api/usage-relay.ts';

const content = (text: string) => `data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"${text}"}]}\n\n`;
const usageFrame = 'data: {"id":"c","object":"text_completion","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4}}\n\n';

/** A socket stand-in: each write waits until the test acknowledges it (or fails it, as a socket that died). */
function sink() {
  const waiting: ((err?: Error | null) => void)[] = [];
  const received: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, callback) {
      received.push(String(chunk));
      waiting.push(callback);
    },
  });
  return { stream, received, waiting, ack: () => waiting.shift()!(), fail: () => waiting.shift()!(new Error('EPIPE')) };
}

const it = suite('SseUsageRelay: generated and relayed frames');

it('frames count as relayed only once their write comes back; the usage frame counts for neither', async () => {
  const relay = new SseUsageRelay(false);
  const socket = sink();
  relay.writeTo(socket.stream);
  relay.write(content('a') + content('b'));
  await tick();
  assert.equal([relay.result.contentFrames, relay.result.relayedFrames], [2, 0], 'written, not yet acknowledged');
  relay.write(content('c'));
  relay.write(content('d').slice(0, 20)); // half a frame: held back, not counted
  await tick();
  socket.ack();
  await tick();
  assert.equal([relay.result.contentFrames, relay.result.relayedFrames], [3, 2], 'the first chunk (two frames) acknowledged');
  relay.write(content('d').slice(20) + usageFrame);
  await tick();
  assert.equal(relay.result.contentFrames, 4);
  assert.equal(relay.result.usage, { prompt_tokens: 3, completion_tokens: 4 });
  // The client goes: the next write fails, the socket closes, and nothing after counts.
  socket.fail();
  socket.stream.destroy();
  await tick();
  assert.ok(relay.destroyed, 'a response that closed destroys the relay');
  assert.equal([relay.result.contentFrames, relay.result.relayedFrames, relay.result.completed], [4, 2, false]);
  assert.not.ok(socket.received.join('').includes('"usage"'), 'the usage frame the client did not ask for is not relayed');
});

it('a stream that runs to its end: every frame relayed, the response ended', async () => {
  const relay = new SseUsageRelay(true);
  const socket = sink();
  relay.writeTo(socket.stream);
  const ended = new Promise((resolve) => socket.stream.once('finish', resolve));
  for (const text of ['a', 'b', 'c']) relay.write(content(text));
  relay.end(usageFrame + 'data: [DONE]\n\n');
  for (let i = 0; i < 20 && !socket.stream.writableFinished; i++) {
    await tick();
    while (socket.waiting.length > 0) socket.ack();
  }
  await ended;
  assert.equal([relay.result.contentFrames, relay.result.relayedFrames, relay.result.completed], [3, 3, true]);
  assert.ok(socket.received.join('').endsWith('data: [DONE]\n\n'));
});

it('an engine that breaks mid-stream: the error frame is relayed and counts as no content', async () => {
  const relay = new SseUsageRelay(false);
  const socket = sink();
  relay.writeTo(socket.stream);
  relay.write(content('a') + content('b').slice(0, 10));
  relay.fail('data: {"error":{"code":"upstream_unreachable"}}\n\ndata: [DONE]\n\n');
  for (let i = 0; i < 10; i++) {
    await tick();
    while (socket.waiting.length > 0) socket.ack();
  }
  assert.equal([relay.result.contentFrames, relay.result.relayedFrames, relay.result.completed], [1, 1, false]);
  assert.ok(socket.received.join('').endsWith('data: [DONE]\n\n'));
});

it.run();
