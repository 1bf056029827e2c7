// The engine as a real child process, the way the gateway runs it: `svc engine --model ID --port 0`.
import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { spawnReferenceEngine } from '../../src/reference-engine/index.ts';
import { configuredModel, post } from './helpers.ts';

test('spawnReferenceEngine starts a child that serves the model and stops on SIGTERM', async () => {
  const engine = await spawnReferenceEngine('ref-gpt2', { configPath: null });
  try {
    assert.ok(engine.pid > 0);
    const models = (await (await fetch(`${engine.url}/v1/models`)).json()) as any;
    assert.is(models.data[0].id, configuredModel('ref-gpt2').checkpoint);
    const r = await post(`${engine.url}/v1/completions`, { prompt: 'Hello world', max_tokens: 4, temperature: 0, prompt_logprobs: -1 });
    assert.is(r.status, 200);
    assert.is(r.json.usage.prompt_tokens, 3);
    const pl = r.json.choices[0].prompt_logprobs;
    assert.is(pl.length, 3);
    for (const pos of pl.slice(1)) {
      const entries = Object.values(pos) as { logprob: number }[];
      assert.is(entries.length, 50257);
      const sum = entries.reduce((s, e) => s + Math.exp(e.logprob), 0);
      assert.ok(Math.abs(sum - 1) < 1e-4, `sum ${sum}`);
    }
    const tok = await post(`${engine.url}/tokenize`, { prompt: 'Hello world', add_special_tokens: false, return_token_strs: true });
    assert.equal(tok.json.tokens, [15496, 995]);
    assert.equal(tok.json.token_strs, ['Hello', 'Ġworld']);
  } finally {
    await engine.stop();
  }
  assert.is(await engine.exited, 0);
});

test('a crash chaos exits the child process', async () => {
  const engine = await spawnReferenceEngine('ref-byte', { configPath: null, chaos: true });
  try {
    await post(`${engine.url}/_chaos`, { mode: 'crash' });
    await fetch(`${engine.url}/v1/completions`, { method: 'POST', body: JSON.stringify({ prompt: 'x', max_tokens: 5 }) }).then(
      (r) => r.text(),
      () => null,
    ).catch(() => null);
    assert.is(await engine.exited, 70);
  } finally {
    await engine.stop();
  }
});

test.run();
