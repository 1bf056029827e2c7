/**
 * The local-process platform on its own, with real reference engine processes: the stages of a boot in
 * order, a crash published as `failed` then restarted, a stop during a boot that kills the process.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import pino from 'pino';
import { LocalProcessPlatform, StaticPlatform, type BootStage, type EngineBootKnobs } from '../../src/platforms/index.ts';
import { until } from '../support/until.ts';

const it = suite('local-process platform');

function platform(knobs: EngineBootKnobs = {}, idleMs = 0) {
  const stages: BootStage[] = [];
  const serving: number[] = [];
  const p = new LocalProcessPlatform({
    modelId: 'ref-byte',
    configPath: null,
    knobs,
    idleMs,
    ackTimeoutMs: 20_000,
    logger: pino({ level: 'silent' }),
    onStage: (modelId, backend, stage) => {
      assert.is(modelId, 'ref-byte');
      assert.is(backend, 'completion');
      stages.push(stage);
    },
    onServing: (_url, pid) => serving.push(pid),
  });
  return { p, stages, serving };
}

const gone = (pid: number) => {
  try {
    process.kill(pid, 0);
    return false;
  } catch {
    return true;
  }
};

it('a boot publishes its stages in order, and one boot serves every caller', async () => {
  const { p, stages, serving } = platform();
  try {
    assert.is(p.runners(), 0);
    const first = p.ensureRunning()!;
    assert.ok(first, 'cold: a boot');
    assert.is(p.ensureRunning(), first, 'the same boot for a second caller');
    await first.ready;
    assert.is(p.ensureRunning(), null, 'warm: nothing to wait for');
    assert.is(p.runners(), 1);
    assert.is(p.spawns, 1);
    assert.equal(stages, ['waiting_for_gpu', 'container_started', 'weights_loading', 'weights_loaded', 'engine_ready', 'serving']);
    assert.is(serving.length, 1);
    const health = await fetch(`${p.url}/health`);
    assert.is(health.status, 200);
  } finally {
    await p.stop();
  }
});

it('a crashed engine publishes failed, is started again, and callers meanwhile wait out that boot', async () => {
  const { p, stages, serving } = platform();
  try {
    await p.warmUp();
    const pid = p.pid!;
    process.kill(pid, 'SIGKILL');
    await until('the crash noticed', async () => p.runners() === 0, 10_000, 20);
    const restart = p.ensureRunning();
    assert.ok(restart, 'a request now waits for the restart');
    await restart!.ready;
    assert.is.not(p.pid, pid);
    assert.is(serving.length, 2);
    const afterCrash = stages.slice(stages.indexOf('failed'));
    assert.equal(afterCrash, ['failed', 'waiting_for_gpu', 'container_started', 'weights_loading', 'weights_loaded', 'engine_ready', 'serving']);
  } finally {
    await p.stop();
  }
});

it('a failed boot rejects its callers and publishes failed with the reason; the next call boots afresh', async () => {
  const knobs: EngineBootKnobs = { fail: true };
  const { p, stages } = platform(knobs);
  try {
    const boot = p.ensureRunning()!;
    const error = await boot.ready.then(() => null, (e: Error) => e);
    assert.is(error?.name, 'BootFailed');
    assert.is(stages[stages.length - 1], 'failed');
    assert.match(p.latestStage()!.reason!, /told to fail/);
    knobs.fail = false;
    await p.ensureRunning()!.ready;
    assert.is(p.spawns, 2);
  } finally {
    await p.stop();
  }
});

it('the idle window stops the engine process; stop() during a boot kills the starting process', async () => {
  const { p } = platform({}, 300);
  try {
    await p.warmUp();
    const pid = p.pid!;
    await until('the idle stop', async () => p.url === null && gone(pid), 10_000, 20);
    assert.is(p.latestStage(), null, 'a stopped engine has no fresh stage');
    const release = p.hold();
    const boot = p.ensureRunning()!;
    await boot.acknowledged;
    await p.stop();
    assert.is(await boot.ready.then(() => 'served', (e: Error) => e.name), 'BootFailed');
    release();
  } finally {
    await p.stop();
  }
});

it('a static platform is always on and cannot count runners', async () => {
  const s = new StaticPlatform('remote', 'http://gpu-host:8000');
  assert.is(s.ensureRunning(), null);
  assert.is(s.runners(), null);
  assert.is(s.url, 'http://gpu-host:8000');
  s.hold()();
});

it.run();
