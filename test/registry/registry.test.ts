import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadSettings, type ModelConfig } from '../../src/config/index.ts';
import { ApiError } from '../../src/errors/index.ts';
import { ModelRegistry } from '../../src/registry/index.ts';

const settings = loadSettings({});
const [byteModel, gpt2Model] = settings.models;

/** A minimal real Hugging Face tokenizer.json: byte-level BPE over the 256 byte symbols, no merges. */
function byteLevelTokenizerJson(): string {
  const printable: number[] = [];
  for (let b = 33; b <= 126; b++) printable.push(b);
  for (let b = 161; b <= 172; b++) printable.push(b);
  for (let b = 174; b <= 255; b++) printable.push(b);
  const chars = new Map<number, string>();
  let extra = 0;
  for (let b = 0; b < 256; b++) chars.set(b, String.fromCodePoint(printable.includes(b) ? b : 256 + extra++));
  const vocab: Record<string, number> = {};
  for (let b = 0; b < 256; b++) vocab[chars.get(b)!] = b;
  return JSON.stringify({
    added_tokens: [{ id: 256, content: '<|endoftext|>', special: true }],
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false },
    decoder: { type: 'ByteLevel' },
    model: { type: 'BPE', vocab, merges: [] },
  });
}

function thrown(fn: () => unknown): ApiError {
  try {
    fn();
  } catch (err) {
    assert.instance(err, ApiError);
    return err as ApiError;
  }
  throw new assert.Assertion({ message: 'expected an ApiError', operator: 'throws', generated: true, expects: 'throw', actual: 'return' });
}

const registry = suite('model registry');

registry('default, get, resolve and listed follow the configuration; staging models are served but not listed', () => {
  const staging: ModelConfig = { ...gpt2Model, id: 'ref-staging', status: 'staging' };
  const reg = new ModelRegistry([byteModel, staging, gpt2Model]);
  assert.is(reg.default.id, 'ref-byte');
  assert.is(reg.resolve(null).id, 'ref-byte');
  assert.is(reg.resolve(undefined).id, 'ref-byte');
  assert.is(reg.resolve('ref-gpt2').id, 'ref-gpt2');
  assert.is(reg.resolve('ref-staging').id, 'ref-staging');
  assert.is(reg.get('ref-staging')?.status, 'staging');
  assert.is(reg.get('nope'), undefined);
  assert.equal(reg.listed().map((m) => m.id), ['ref-byte', 'ref-gpt2']);
  assert.equal(reg.all().map((m) => m.id), ['ref-byte', 'ref-staging', 'ref-gpt2']);
  const err = thrown(() => reg.resolve('gpt-4'));
  assert.is(err.status, 400);
  assert.is(err.code, 'model_not_found');
  assert.match(err.message, 'available models: ref-byte, ref-gpt2');
  assert.not.match(err.message, 'ref-staging');
  reg.close();
});

registry('a configuration without exactly one live default model is refused', () => {
  assert.throws(() => new ModelRegistry([{ ...byteModel, default: false }, gpt2Model]), /exactly one live default/);
  assert.throws(() => new ModelRegistry([{ ...byteModel, status: 'staging' }]), /exactly one live default/);
});

registry('tokenizers load at start and are shared per spec', async () => {
  const reg = new ModelRegistry(settings.models);
  await reg.loadTokenizers();
  assert.is(reg.tokenizer('ref-byte').vocabSize, 258);
  assert.is(reg.tokenizer('ref-gpt2').vocabSize, 50257);
  assert.is(reg.tokenizerState('ref-byte')?.status, 'ready');
  reg.close();
});

registry('a tokenizer that fails to load answers 503 with Retry-After, retries in the background and recovers; other models are unaffected', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'svc-registry-'));
  try {
    const path = join(dir, 'tokenizer.json');
    const hfModel: ModelConfig = { ...gpt2Model, id: 'ref-hf', tokenizer: { kind: 'hf', path } };
    const failures: string[] = [];
    const reg = new ModelRegistry([byteModel, hfModel], {
      retryInitialMs: 20,
      retryMaxMs: 40,
      onTokenizerError: (id) => failures.push(id),
    });
    await Promise.all([reg.loadTokenizers(), reg.loadTokenizers()]); // never throws; concurrent calls share one attempt
    assert.is(reg.tokenizer('ref-byte').vocabSize, 258);
    const state = reg.tokenizerState('ref-hf');
    assert.is(state?.status, 'failed');
    const err = thrown(() => reg.tokenizer('ref-hf'));
    assert.is(err.status, 503);
    assert.is(err.code, 'tokenizer_unavailable');
    assert.is(err.headers['retry-after'], '1');
    assert.equal(failures, ['ref-hf']); // one attempt so far, however often loadTokenizers was called

    writeFileSync(path, byteLevelTokenizerJson());
    const tokenizer = await reg.whenTokenizerReady('ref-hf');
    assert.is(tokenizer.vocabSize, 257);
    assert.is(reg.tokenizer('ref-hf'), tokenizer);
    assert.equal(tokenizer.encode('hi', false), [104, 105]);
    assert.ok(failures.length >= 1);
    reg.close();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

registry('close() stops the retries and rejects waiters', async () => {
  const hfModel: ModelConfig = { ...gpt2Model, id: 'ref-hf', tokenizer: { kind: 'hf', path: join(tmpdir(), 'svc-registry-missing', 'tokenizer.json') } };
  const reg = new ModelRegistry([byteModel, hfModel], { retryInitialMs: 60_000 });
  await reg.loadTokenizers();
  const waiting = reg.whenTokenizerReady('ref-hf');
  reg.close();
  try {
    await waiting;
    assert.unreachable('should reject');
  } catch (err) {
    assert.match((err as Error).message, 'closed');
  }
  assert.is(reg.tokenizerState('ref-hf')?.status, 'failed');
});

registry.run();
