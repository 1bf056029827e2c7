import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ConfigError, defaultConfigPath, loadSettings, parseServiceConfig, resolveAdminToken } from '../../src/config/index.ts';

const config = suite('configuration');
const svc = fileURLToPath(new URL('../../bin/svc.js', import.meta.url));
const base = () => JSON.parse(readFileSync(defaultConfigPath, 'utf8'));

function rejects(mutate: (c: any) => void, field: RegExp) {
  const c = base();
  mutate(c);
  try {
    parseServiceConfig(c, 'models.json');
    assert.unreachable('accepted');
  } catch (err) {
    assert.instance(err, ConfigError);
    assert.match((err as Error).message, field);
  }
}

config('the built-in configuration is valid and has one default model', () => {
  const settings = loadSettings({});
  assert.is(settings.port, 8080);
  assert.is(settings.host, '127.0.0.1');
  assert.is(settings.models.filter((m) => m.default).length, 1);
});

config('invalid configuration names the field', () => {
  rejects((c) => (c.models[0].capabilities.max_logprobs = 101), /models\[0\]\.capabilities\.max_logprobs/);
  rejects((c) => delete c.models[1].checkpoint, /models\[1\]\.checkpoint/);
  rejects((c) => (c.models[0].typo = 1), /models\[0\]\.typo/);
  rejects((c) => (c.models[1].engine = 'ftp://x'), /models\[1\]\.engine/);
  rejects((c) => (c.models[1].default = true), /default/);
  rejects((c) => (c.models[1].id = c.models[0].id), /models\[1\]\.id/);
  rejects((c) => (c.models[0].tokenizer = { kind: 'sentencepiece' }), /models\[0\]\.tokenizer/);
  rejects((c) => (c.models[0].activations.d_model = 32), /models\[0\]\.activations\.d_model differs/);
  rejects((c) => (c.models[0].activations = { ...c.models[0].activations, n_layers: null, max_capture_bytes: 1000 }), /models\[0\]\.activations\.max_capture_bytes needs n_layers and d_model/);
});

config('bad environment variables name the variable', () => {
  assert.throws(() => loadSettings({ PORT: 'eighty' }), /PORT/);
  assert.throws(() => loadSettings({ PORT: '70000' }), /PORT/);
});

config('svc serve with an invalid models file exits 1 with a message naming the field', () => {
  const dir = mkdtempSync(join(tmpdir(), 'svc-config-'));
  try {
    const c = base();
    c.models[0].capabilities.max_model_len = 'long';
    writeFileSync(join(dir, 'models.json'), JSON.stringify(c));
    const run = spawnSync(process.execPath, [svc, 'serve'], { env: { ...process.env, SVC_CONFIG: join(dir, 'models.json'), DATA_DIR: join(dir, 'data'), PORT: '0' }, encoding: 'utf8', timeout: 60_000 });
    assert.is(run.status, 1);
    assert.match(run.stderr, /models\[0\]\.capabilities\.max_model_len/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

config('the generated admin token is stored readable by the owner only and reused', () => {
  const dir = mkdtempSync(join(tmpdir(), 'svc-token-'));
  try {
    const first = resolveAdminToken({}, dir);
    assert.ok(first.created);
    assert.is(statSync(join(dir, 'admin-token')).mode & 0o777, 0o600);
    const second = resolveAdminToken({}, dir);
    assert.not.ok(second.created);
    assert.is(second.token, first.token);
    assert.is(resolveAdminToken({ SVC_ADMIN_TOKEN: 'set-by-env' }, dir).token, 'set-by-env');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

config('SVC_HARVEST_TRANSPORT=kafka needs KAFKA_BROKERS as host:port; its other variables are read with it, and only then', () => {
  assert.throws(() => loadSettings({ SVC_HARVEST_TRANSPORT: 'rabbitmq' }), /SVC_HARVEST_TRANSPORT.*inprocess, postgres or kafka/);
  assert.throws(() => loadSettings({ SVC_HARVEST_TRANSPORT: 'kafka' }), /SVC_HARVEST_TRANSPORT=kafka needs KAFKA_BROKERS/);
  assert.throws(() => loadSettings({ SVC_HARVEST_TRANSPORT: 'kafka', KAFKA_BROKERS: 'k1:9092,k2' }), /KAFKA_BROKERS: "k2"/);
  const kafka = loadSettings({ SVC_HARVEST_TRANSPORT: 'kafka', KAFKA_BROKERS: ' k1:9092, k2:9093 ' }).harvest.kafka;
  assert.equal(kafka, { brokers: ['k1:9092', 'k2:9093'], ssl: false, sasl: null, topicPrefix: 'svc.dispatch.', groupPrefix: 'svc.dispatch.', partitions: 8, sessionTimeoutMs: 30_000 });
  const secured = { SVC_HARVEST_TRANSPORT: 'kafka', KAFKA_BROKERS: 'k1:9093', KAFKA_SSL: 'on', KAFKA_SASL_MECHANISM: 'scram-sha-512', SVC_KAFKA_PARTITIONS: '3', SVC_KAFKA_TOPIC_PREFIX: 'jobs.', SVC_KAFKA_SESSION_TIMEOUT_MS: '6000' };
  assert.throws(() => loadSettings(secured), /KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD/);
  const full = loadSettings({ ...secured, KAFKA_SASL_USERNAME: 'svc', KAFKA_SASL_PASSWORD: 'pw' }).harvest.kafka;
  assert.equal(full, { brokers: ['k1:9093'], ssl: true, sasl: { mechanism: 'scram-sha-512', username: 'svc', password: 'pw' }, topicPrefix: 'jobs.', groupPrefix: 'svc.dispatch.', partitions: 3, sessionTimeoutMs: 6_000 });
  assert.throws(() => loadSettings({ ...secured, KAFKA_SASL_MECHANISM: '', SVC_KAFKA_SESSION_TIMEOUT_MS: '500' }), /SVC_KAFKA_SESSION_TIMEOUT_MS/);
  assert.throws(() => loadSettings({ ...secured, KAFKA_SASL_MECHANISM: 'gssapi' }), /KAFKA_SASL_MECHANISM/);
  assert.throws(() => loadSettings({ ...secured, KAFKA_SASL_MECHANISM: '', SVC_KAFKA_PARTITIONS: '0' }), /SVC_KAFKA_PARTITIONS/);
  assert.is(loadSettings({ KAFKA_BROKERS: 'k1:9092', KAFKA_SASL_MECHANISM: 'gssapi' }).harvest.kafka, null, 'unread unless the transport is kafka');
});

config.run();
