/** `svc projections status|rebuild [name]`: opens the store as the server would and runs the command. */
import type { Settings } from '../config/index.ts';
import { runProjectionsCommand } from '../projection-runner/index.ts';
import { openEventStore } from '../store/index.ts';
import { projections } from '../../projections/index.ts';

export async function projectionsCommand(args: string[], settings: Settings): Promise<number> {
  if (args[0] !== 'status' && args[0] !== 'rebuild') {
    process.stderr.write('usage: svc projections status [--json]\n       svc projections rebuild [name]\n');
    return 2;
  }
  // With the embedded store, a running server holds DATA_DIR: opening fails with DataDirLocked, which says so.
  const store = await openEventStore({
    databaseUrl: settings.databaseUrl,
    dataDir: settings.dataDir,
    purpose: `svc projections ${args.join(' ')}`,
  });
  try {
    return await runProjectionsCommand(args, { store, projections, stdout: process.stdout, stderr: process.stderr });
  } finally {
    await store.close();
  }
}
