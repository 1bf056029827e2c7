import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import OpenAI from 'openai';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';
import { loadSettings } from '../../src/config/index.ts';

// The official client, unchanged, as a researcher would use it.
const client = suite('official openai client against the gateway');
let gw: TestGateway;
let openai: OpenAI;

client.before(async () => {
  // ref-byte only: nothing here calls ref-gpt2, whose engine would start for nothing.
  gw = await startTestGateway({ models: loadSettings().models.filter((m) => m.id === 'ref-byte') });
  openai = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: gw.apiKey, maxRetries: 0 });
});
client.after(async () => {
  await gw?.stop();
});

client('completions.create (non-streaming) with logprobs', async () => {
  const completion = await openai.completions.create({ model: 'ref-byte', prompt: 'Once upon a time', max_tokens: 8, temperature: 0, logprobs: 2 });
  assert.is(completion.object, 'text_completion');
  assert.is(completion.model, 'svc/ref-byte-4l-64d-dummy');
  assert.is(completion.choices.length, 1);
  assert.ok(completion.choices[0].logprobs?.tokens?.length);
  assert.is(completion.usage?.prompt_tokens, 17);
});

client('completions.create (streaming) with include_usage', async () => {
  const stream = await openai.completions.create({ model: 'ref-byte', prompt: 'Once upon a time', max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = '';
  let usage: OpenAI.Completions.CompletionUsage | undefined;
  for await (const chunk of stream) {
    if (chunk.choices.length > 0) text += chunk.choices[0].text;
    if (chunk.usage) usage = chunk.usage;
  }
  const whole = await openai.completions.create({ model: 'ref-byte', prompt: 'Once upon a time', max_tokens: 8, temperature: 0 });
  assert.is(text, whole.choices[0].text);
  assert.is(usage?.completion_tokens, whole.usage?.completion_tokens);
});

client('engine-native parameters pass at the top level; errors surface as APIError with our code', async () => {
  const completion = await openai.completions.create({ model: 'ref-byte', prompt: 'abc', max_tokens: 2, temperature: 0.7, seed: 3, top_k: 5, min_p: 0.01 } as never);
  assert.is(completion.choices.length, 1);
  try {
    await openai.completions.create({ model: 'no-such-model', prompt: 'abc', max_tokens: 2 });
    assert.unreachable('should have thrown');
  } catch (err) {
    assert.instance(err, OpenAI.APIError);
    const e = err as InstanceType<typeof OpenAI.APIError>;
    assert.is(e.status, 400);
    assert.is(e.code, 'model_not_found');
  }
  try {
    await openai.chat.completions.create({ model: 'ref-byte', messages: [{ role: 'user', content: 'hi' }] });
    assert.unreachable('should have thrown');
  } catch (err) {
    assert.is((err as InstanceType<typeof OpenAI.APIError>).code, 'chat_completions_unsupported');
  }
});

client.run();
