/**
 * The contract ages stale jobs out during a submit, before the quota counts: the submit whose
 * admission frees a stale job's slot fails that job on its stream before it answers, so the next read
 * of the job says `failed` (`stale`). Driven through the real harvest service on a real store (PGlite,
 * and PostgreSQL when DATABASE_URL is set) with no workflow running, so nothing but the submit can have
 * aged the job out; the clock is the service's own, moved past the stale window.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { mkdtempSync, rmSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadSettings } from '../../src/config/index.ts';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { inProcessTransport } from '../../src/dispatch/index.ts';
import { ModelRegistry } from '../../src/registry/index.ts';
import { fileHarvestStorage, HarvestService, type HarvestCaller } from '../../src/harvest/index.ts';
import { harvestQuotaStream } from '../../events/harvest.ts';
import { adaptersUnderTest } from '../store/adapters.ts';

const quiet = { info() {}, warn() {}, error() {} };

for (const adapter of adaptersUnderTest()) {
  const it = suite(`a submit ages out a stale job before it answers (${adapter.name})`);

  it('the job whose slot the admission freed as stale reads failed, stale, once the submit has answered', async () => {
    const root = mkdtempSync(join(tmpdir(), 'svc-harvest-stale-'));
    const store = await adapter.open();
    try {
      const settings = loadSettings({ ...process.env, DATABASE_URL: '', SVC_HARVEST_DIR: root });
      const harvest = { ...settings.harvest, storageDir: root, maxRunningPerKey: 1 };
      let clock = Date.parse('2026-11-26T12:00:00.000Z');
      const service = new HarvestService({
        handler: new CommandHandler({ store }),
        db: store,
        storage: fileHarvestStorage(root),
        transport: inProcessTransport(),
        registry: new ModelRegistry(settings.models),
        settings: harvest,
        logger: quiet,
        now: () => new Date(clock),
      });
      const caller: HarvestCaller = {
        keyId: `k_${randomUUID()}`,
        prefix: 'svc_test',
        userId: 'u1',
        email: 'tests@example.org',
        budgets: { monthly_token_budget: null, daily_token_budget: null, monthly_input_token_budget: null, monthly_output_token_budget: null, monthly_harvest_jobs: null },
      };
      const stuck = await service.submit(caller, { model: 'ref-byte', prompts: ['never claimed'], layers: [0] });
      assert.is(stuck.status, 'running');
      clock += harvest.staleAfterMs + 1_000;
      const next = await service.submit(caller, { model: 'ref-byte', prompts: ['takes the slot'], layers: [0] });
      assert.is(next.status, 'running');
      const released = (await store.readStream(harvestQuotaStream(caller.keyId))).events.filter((e) => e.type === 'HarvestSlotReleased');
      assert.equal(released.map((e) => (e.data as { job_id: string; reason: string }).reason), ['stale']);
      const aged = await service.state(stuck.id);
      assert.is(aged.status, 'failed');
      assert.is(aged.error?.code, 'stale');
    } finally {
      await store.close();
      rmSync(root, { recursive: true, force: true });
    }
  });

  it.after(async () => {
    await adapter.cleanup();
  });
  it.run();
}
