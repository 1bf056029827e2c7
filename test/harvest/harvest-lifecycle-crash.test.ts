/**
 * A harvest job's life, its processing killed after each step (on PGlite, and on PostgreSQL when
 * DATABASE_URL is set). The dying process is a harvest service and worker of their own (their own
 * command handler and in-process transport) on the gateway's store: once the step is stored, every
 * later command, read and publish of it never returns, as a process killed there. The gateway beside
 * it is the survivor (its resumer, its worker, its workflows). Whatever the step, the job ends
 * succeeded with each shard recorded once, in order, and the key's slot is released once: by the
 * harvest-slots workflow when the job ended, or (killed before the job was recorded) by the next
 * admission once the admission is an orphan, uncounted.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadSettings, type Settings } from '../../src/config/index.ts';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { inProcessTransport, type DispatchTransport } from '../../src/dispatch/index.ts';
import { EngineClient } from '../../src/engine-client/index.ts';
import { TokenizerPool } from '../../src/tokenizer/index.ts';
import { fileHarvestStorage, HarvestService, HarvestWorker, type HarvestCaller } from '../../src/harvest/index.ts';
import { harvestEvents, harvestQuotaStream, harvestStream } from '../../events/harvest.ts';
import { harvestOrphanAdmissionMs } from '../../deciders/harvest-quota.ts';
import { issueKey, startTestGateway, type TestGateway } from '../support/gateway.ts';
import { postgresUnavailable, scratchDatabase } from '../support/postgres.ts';
import { until } from '../support/until.ts';

/** The steps of a job's life, in order, each named `<command or publish>#<occurrence>`. */
const steps = ['Admit#0', 'Submit#0', 'publish#0', 'Start#0', 'Claim#0', 'RecordShard#0', 'RecordShard#1', 'RecordShard#2', 'Succeed#0'] as const;
const lifeSteps = new Set(['Admit', 'Submit', 'Start', 'Claim', 'RecordShard', 'Succeed']);
const never = new Promise<never>(() => {});
const quiet = { info() {}, warn() {}, error() {} };

/** A process that dies once `killAfter` is stored: a service and a worker on their own handler and transport. */
function dyingProcess(gw: TestGateway, settings: Settings, tokenizers: TokenizerPool, killAfter: string) {
  const seen = new Map<string, number>();
  let dead = false;
  const stepped = (name: string) => {
    const n = seen.get(name) ?? 0;
    seen.set(name, n + 1);
    if (`${name}#${n}` === killAfter) dead = true;
  };
  const handler = new CommandHandler({ store: gw.store });
  const dyingHandler = new Proxy(handler, {
    get(target, property) {
      if (property === 'handle') {
        return async (...args: Parameters<CommandHandler['handle']>) => {
          if (dead) return never;
          const outcome = await target.handle(...args);
          const type = (args[1] as { type: string }).type;
          if (outcome.accepted && outcome.newEvents.length > 0 && lifeSteps.has(type)) stepped(type);
          return dead ? never : outcome;
        };
      }
      if (property === 'load') return async (...args: Parameters<CommandHandler['load']>) => (dead ? never : target.load(...args));
      const value = Reflect.get(target, property);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  const transport = inProcessTransport();
  const dyingTransport = new Proxy(transport, {
    get(target, property) {
      if (property === 'publish') {
        return async (...args: Parameters<DispatchTransport['publish']>) => {
          if (dead) return never;
          const published = await target.publish(...args);
          stepped('publish');
          return dead ? never : published;
        };
      }
      const value = Reflect.get(target, property);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
  const storage = fileHarvestStorage(settings.harvest.storageDir);
  const service = new HarvestService({ handler: dyingHandler, db: gw.store, storage, transport: dyingTransport, registry: gw.registry, settings: settings.harvest, logger: quiet });
  const engines = new EngineClient(settings.models.filter((m) => gw.engineUrls.has(m.id)).map((m) => ({ modelId: m.id, url: gw.engineUrls.get(m.id)!, checkpoint: m.checkpoint, gpuShape: m.gpu_shape })));
  const worker = new HarvestWorker({
    service,
    storage,
    transport: dyingTransport,
    registry: gw.registry,
    engines,
    context: { registry: gw.registry, tokenizers, requestWindowMs: settings.requestWindowMs, deadlineTokensPerSecond: settings.deadlineTokensPerSecond },
    settings: settings.harvest,
    logger: quiet,
    workerId: `dying-after-${killAfter}`,
  });
  worker.start();
  return {
    service,
    dead: () => dead,
    /** Lets what is left of it go (its hung calls never return). */
    bury: () => {
      void worker.stop().catch(() => undefined);
      void transport.close().catch(() => undefined);
      void engines.close().catch(() => undefined);
    },
  };
}

const databaseUrl = process.env.DATABASE_URL;
const variants = [{ name: 'PGlite', postgres: false }, ...((await postgresUnavailable(databaseUrl)) ? [] : [{ name: 'PostgreSQL', postgres: true }])];

for (const variant of variants) {
  const it = suite<{ gw: TestGateway; settings: Settings; tokenizers: TokenizerPool; drop?: () => Promise<void>; dir: string }>(`a harvest killed after each step of its life (${variant.name})`);

  it.before(async (context) => {
    context.dir = mkdtempSync(join(tmpdir(), 'svc-lifecycle-crash-'));
    const scratch = variant.postgres ? await scratchDatabase(databaseUrl!, 'lifecycle_crash') : null;
    context.drop = scratch?.drop;
    const base = loadSettings({ ...process.env, DATABASE_URL: '', SVC_HARVEST_DIR: context.dir });
    const models = base.models.filter((m) => m.id === 'ref-byte');
    // A lease a loaded machine renews in time (a third of it between renewals), short enough to wait out at each step.
    const overrides: Partial<Settings> = { models, harvest: { ...base.harvest, leaseMs: 3_000, maxRunningPerKey: 1 }, ...(scratch ? { databaseUrl: scratch.url } : {}) };
    context.gw = await startTestGateway(overrides);
    context.settings = { ...base, ...overrides };
    context.tokenizers = new TokenizerPool(1);
  });

  it.after(async (context) => {
    await context.tokenizers?.close();
    await context.gw?.stop();
    await context.drop?.();
    rmSync(context.dir, { recursive: true, force: true });
    // The dead processes' hung calls keep their timers (a claim renewal every third of a lease): once the
    // last suite is done and uvu has told its result, the test process ends with that result.
    if (variant === variants[variants.length - 1]) setTimeout(() => process.exit(process.exitCode ?? 0), 2_000).unref();
  });

  for (const killAfter of steps) {
    it(`killed after ${killAfter}: each shard recorded once, the job succeeded, the key's slot released once`, async ({ gw, settings, tokenizers }) => {
      const key = await issueKey(gw.url, gw.adminToken, { email: `crash-${killAfter.replace('#', '-')}@example.org`.toLowerCase() });
      const authenticated = await gw.keys.authenticate(`Bearer ${key}`);
      assert.ok(authenticated.ok);
      const view = authenticated.key;
      const caller: HarvestCaller = { keyId: view.keyId, prefix: view.prefix, userId: view.userId, email: view.email, budgets: view.budgets };
      const dying = dyingProcess(gw, settings, tokenizers, killAfter);
      try {
        const submitted = dying.service.submit(caller, { model: 'ref-byte', prompts: ['first prompt', 'second prompt', 'third prompt'], layers: [0], shard_size: 1, batch_size: 1 });
        void submitted.catch(() => undefined);
        await until(`the process killed after ${killAfter}`, async () => dying.dead(), 60_000, 20);
        const quota = async () => (await gw.store.readStream(harvestQuotaStream(caller.keyId))).events;
        const jobId = ((await quota()).find((e) => e.type === 'HarvestJobAdmitted')!.data as { job_id: string }).job_id;
        const jobEvents = async () => (await gw.store.readStream(harvestStream(jobId))).events.map((e) => harvestEvents.parse(e));
        const releases = async () => (await quota()).filter((e) => e.type === 'HarvestSlotReleased').map((e) => e.data as { job_id: string; counted: boolean });

        if (killAfter === 'Admit#0') {
          // Never recorded: the next admission, once the admission is an orphan, releases its slot uncounted.
          assert.equal(await jobEvents(), []);
          const later = new HarvestService({
            handler: gw.commands,
            db: gw.store,
            storage: fileHarvestStorage(settings.harvest.storageDir),
            transport: inProcessTransport(),
            registry: gw.registry,
            settings: settings.harvest,
            logger: quiet,
            now: () => new Date(Date.now() + harvestOrphanAdmissionMs),
          });
          const next = await later.submit(caller, { model: 'ref-byte', prompts: ['after the orphan'], layers: [0] });
          assert.equal((await releases()).map((r) => [r.job_id, r.counted]), [[jobId, false]], 'released once, uncounted');
          await later.cancel(caller, next.id);
          return;
        }

        const done = await until(
          'the survivor to finish the job',
          async () => {
            const state = await gw.harvests.state(jobId);
            return state.status === 'pending' || state.status === 'running' ? null : state;
          },
          120_000,
          100,
        );
        assert.is(done.status, 'succeeded', JSON.stringify(done.error));
        const events = await jobEvents();
        const written = events.filter((e) => e.type === 'HarvestShardWritten').map((e) => (e.data as { shard: number }).shard);
        assert.equal(written, [0, 1, 2], 'each shard recorded once, in order');
        assert.is(events.filter((e) => e.type === 'HarvestSucceeded').length, 1);
        const released = await until('the slot released', async () => ((await releases()).length > 0 ? releases() : null), 60_000, 100);
        assert.equal(released.map((r) => [r.job_id, r.counted]), [[jobId, true]], 'released once, counted');
      } finally {
        dying.bury();
      }
    });
  }

  it.run();
}
