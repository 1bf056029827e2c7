/** `svc projections ...`: opens the store as the server would; the commands themselves live in the projection runner. */
import type { Settings } from '../config/index.ts';
import { isProjectionsCommand, projectionsUsage, runProjectionsCommand } from '../processors/index.ts';
import { openEventStore } from '../store/index.ts';
import { withEventLog } from './read-store.ts';
import { projections } from '../../projections/index.ts';

export async function projectionsCommand(args: string[], settings: Settings): Promise<number> {
  if (!isProjectionsCommand(args)) {
    process.stderr.write(projectionsUsage);
    return 2;
  }
  // With the embedded store, a running server holds DATA_DIR: opening fails with DataDirLocked, which says so.
  const store = await openEventStore({
    databaseUrl: settings.databaseUrl,
    dataDir: settings.dataDir,
    purpose: `svc projections ${args.join(' ')}`,
    // a rebuild's swap copies whole tables in one statement: no statement timeout unless one is configured
    ...(process.env.SVC_DB_STATEMENT_TIMEOUT_MS ? {} : { statementTimeoutMs: 0 }),
  });
  try {
    return await withEventLog(settings, store, (log) => runProjectionsCommand(args, { store, log, projections, stdout: process.stdout, stderr: process.stderr }));
  } finally {
    await store.close();
  }
}
