/**
 * GET /v1/models/{id}/status for a model whose engines run elsewhere (the `static` platform: a fixed
 * URL, booted by no process of this gateway): its activation engine's stage is the one logged on its
 * backend stream by whatever boots it, here another writer of the same store (a second command
 * handler, as another process would be), read back through the gateway's log subscription.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';
import { startFailingEngine, staticModel, type FailingEngine } from '../support/failing-engine.ts';
import { until } from '../support/until.ts';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { backendDecider } from '../../deciders/backend.ts';
import { backendStream } from '../../events/backend.ts';

const it = suite('model status of a static platform');
let gw: TestGateway;
let engine: FailingEngine;

it.before(async () => {
  engine = await startFailingEngine('ok');
  const model = { ...staticModel(engine.url, 'remote'), activations: { n_layers: 4, max_steering_vectors: 1, max_activation_prompt_tokens: 512, d_model: 64 } };
  gw = await startTestGateway({ models: [model] });
});
it.after(async () => {
  await gw?.stop();
  await engine?.close();
});

const status = async () => json(await fetch(`${gw.url}/v1/models/remote/status`, { headers: gw.authHeaders() }));

it("the activation engine's logged stage is reported, and is its own (not the completion engine's)", async () => {
  const before = await status();
  assert.equal(before.activation_boot, { stage: null, at: null, age_seconds: null, reason: null }, 'nothing logged yet');
  const elsewhere = new CommandHandler({ store: gw.store });
  await elsewhere.handle(backendStream('remote', 'activation'), { type: 'PublishBootStage', backend: 'activation', stage: 'weights_loading', now: new Date().toISOString() }, backendDecider);
  const loading = await until('the logged stage in the status', async () => {
    const body = await status();
    return body.activation_boot.stage === null ? null : body;
  }, 20_000, 50);
  assert.is(loading.activation_boot.stage, 'weights_loading');
  assert.type(loading.activation_boot.age_seconds, 'number');
  assert.is(loading.activation_boot.reason, null);
  assert.is(loading.boot, null, "the completion engine's own stage is untouched");
  await elsewhere.handle(backendStream('remote', 'activation'), { type: 'PublishBootStage', backend: 'activation', stage: 'failed', now: new Date().toISOString(), reason: 'out of memory' }, backendDecider);
  const failed = await until('the next stage', async () => {
    const body = await status();
    return body.activation_boot.stage === 'failed' ? body : null;
  }, 20_000, 50);
  assert.is(failed.activation_boot.reason, 'out of memory');
});

it.run();
