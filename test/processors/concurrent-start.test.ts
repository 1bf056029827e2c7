/**
 * Processes started at once on a fresh PostgreSQL database (a deployment's gateways and `svc worker`s
 * after a restart): each one's projection runner sets up the read models' tables at its start, and
 * none fails for another doing the same (their setups take turns); the workflow processors' too. Skipped without DATABASE_URL.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { ProjectionRunner, WorkflowProcessor } from '../../src/processors/index.ts';
import { CommandHandler } from '../../src/command-handler/index.ts';
import { workflows } from '../../workflows/index.ts';
import { openEventStore, type EventStore } from '../../src/store/index.ts';
import { projections } from '../../projections/index.ts';
import { postgresUnavailable, scratchDatabase } from '../support/postgres.ts';

const databaseUrl = process.env.DATABASE_URL;
const unavailable = await postgresUnavailable(databaseUrl);
const it = suite('projection runners starting at once on one PostgreSQL database');

if (!unavailable) {
  it('four processes starting together on a fresh database: every projection runner and workflow processor starts', async () => {
    for (let round = 0; round < 3; round++) {
      const scratch = await scratchDatabase(databaseUrl!, 'concurrent_start');
      const stores: EventStore[] = [];
      const runners: (ProjectionRunner | WorkflowProcessor)[] = [];
      try {
        // Each process migrates the store, one at a time (the migrations' own lock), then starts its runner.
        for (let i = 0; i < 4; i++) stores.push(await openEventStore({ databaseUrl: scratch.url }));
        for (const store of stores) {
          runners.push(new ProjectionRunner({ store, projections, leaseMs: 3_000 }));
          runners.push(new WorkflowProcessor({ store, handler: new CommandHandler({ store }), workflows, leaseMs: 3_000 }));
        }
        const started = await Promise.allSettled(runners.map((r) => r.start()));
        const failed = started.flatMap((s) => (s.status === 'rejected' ? [(s.reason as Error).message] : []));
        assert.equal(failed, [], `round ${round}: ${failed.join('; ')}`);
      } finally {
        for (const r of runners) await r.stop().catch(() => undefined);
        for (const s of stores) await s.close().catch(() => undefined);
        await scratch.drop();
      }
    }
  });
} else {
  it.skip(`projection runners starting at once: ${unavailable}`, () => {});
}

it.run();
