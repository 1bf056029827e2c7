import { ConfigError, loadSettings, resolveAdminToken, resolveSqlPasswords, type Settings } from '../config/index.ts';
import { join } from 'node:path';
import { OWNER_ONLY_UMASK, tightenDataDir, tightenedLine } from '../config/data-dir-mode.ts';

const usage = `usage: svc <command> [options]

commands:
  serve [--sql-port N|off] [--no-workers]
                                 run the gateway (store, reference engines, API, harvest workers) on HOST:PORT;
                                 --no-workers: leave harvest jobs to \`svc worker\` processes
                                 --sql-port: the embedded store, read-only, over the PostgreSQL protocol on 127.0.0.1:N (0: any;
                                 \`npm start\` serves it on any free port unless told --sql-port N or off)
  sql "SELECT ..." [--json]      one read-only query (while the gateway runs: through its SQL port)
  sql --url                      the running gateway's SQL port as a connection URL for psql (user analyst)
  sql-role NAME                  PostgreSQL: a login role that reads the analysts' tables and events only
  engine [--model ID] [--port N] run a reference engine for one model (default: the default model)
  projections status             lag of each projection behind the event log
  projections rebuild [name]     replay projections from the event log and swap them in
  audit usage --key PREFIX [--month YYYY-MM] [--json]
                                 recompute a key's month from the log, compare with key_usage (exit 1 on a difference)
  audit statement --key PREFIX [--month YYYY-MM] [--format csv|json] [--by user]
                                 a key's month, one line per request, for finance; exit 1 if usage_ledger disagrees
  events read STREAM [--json]    one stream's events: version, type, time, data, metadata
  events tail [--json] [--from POSITION|start]
                                 follow the global log live (from the head by default)
  worker                         work on harvest jobs only (no HTTP): needs DATABASE_URL and SVC_HARVEST_TRANSPORT=postgres or kafka
  harvest submit|watch|download  bulk activation harvests through a running gateway (svc harvest --help)
  keys create|list|show|pause|resume|revoke|set-budget
                                 manage API keys through a running gateway (svc keys --help)

environment: PORT (8080), HOST (127.0.0.1), DATA_DIR (./data), DATABASE_URL, SVC_CONFIG (models file),
             SVC_EVENT_LOG (sql, or eventstoredb with EVENTSTORE_URL),
             SVC_ADMIN_TOKEN, LOG_LEVEL (info), SVC_URL (svc keys, svc harvest: http://127.0.0.1:8080),
             SVC_API_KEY (svc harvest)`;

async function serve(settings: Settings, args: string[], role: 'serve' | 'worker' = 'serve'): Promise<number> {
  let sqlPort: number | null = null;
  const usageLine = role === 'worker' ? 'usage: svc worker' : 'usage: svc serve [--sql-port N|off] [--no-workers]   (N: a TCP port on 127.0.0.1, 0 for any free one)';
  for (let i = 0; i < args.length; i++) {
    const [flag, inline] = args[i].split('=', 2);
    if (role === 'serve' && flag === '--no-workers' && inline === undefined) {
      settings = { ...settings, harvest: { ...settings.harvest, workers: 0 } };
      continue;
    }
    const given = role === 'serve' && flag === '--sql-port' ? (inline ?? args[++i]) : undefined;
    const value = Number(given);
    if (given !== 'off' && !(given !== undefined && /^\d+$/.test(given) && value < 65536)) {
      process.stderr.write(`${usageLine}\n`);
      return 2;
    }
    sqlPort = given === 'off' ? null : value;
  }
  if (sqlPort !== null && settings.databaseUrl) {
    process.stderr.write('svc serve: --sql-port serves the embedded store; with DATABASE_URL, give analysts a read-only role (svc sql-role NAME)\n');
    return 2;
  }
  if (role === 'worker' && (!settings.databaseUrl || settings.harvest.transport === 'inprocess')) {
    process.stderr.write('svc worker: a worker process shares the gateway\'s PostgreSQL: set DATABASE_URL, and SVC_HARVEST_TRANSPORT=postgres (or kafka) here and on the gateways\n');
    return 2;
  }
  if (role === 'worker' && settings.harvest.workers === 0) settings = { ...settings, harvest: { ...settings.harvest, workers: 1 } };
  // Signals count from here: one that comes while the gateway starts stops it once it has started. npm
  // forwards SIGINT/SIGTERM to its script although the process group got it too: one shutdown either way.
  let stopSignal: NodeJS.Signals | null = null;
  let wake = () => {};
  const onSignal = (signal: NodeJS.Signals) => {
    if (stopSignal) return;
    stopSignal = signal;
    wake();
  };
  for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) process.on(signal, onSignal);
  // DATA_DIR is owner-only: everything this process, PGlite and the engines create is born 0700/0600,
  // and what an earlier release (or a copy) left wider is tightened, said in one line.
  process.umask(OWNER_ONLY_UMASK);
  const tightened = tightenedLine(tightenDataDir(settings.dataDir));
  if (tightened) process.stderr.write(tightened);
  // Before anything starts, or even loads: a held data directory or a taken port is one line, not a stack
  // trace later, and the check imports only what it reads (the gateway's modules take seconds on a busy machine).
  if (role === 'serve') await (await import('../gateway/preflight.ts')).checkServeCanStart(settings, sqlPort);
  const { startGateway } = await import('../gateway/index.ts');
  const admin = resolveAdminToken(process.env, settings.dataDir);
  const sql = sqlPort === null ? null : resolveSqlPasswords(process.env, settings.dataDir, true);
  // SVC_ENGINE_CHAOS=1 gives reference engines their failure-injection route (for tests of a whole `svc serve`).
  // The store's nested-call check costs promise hooks on every promise (see OpenEventStoreOptions.nestedCallCheck);
  // the in-process gateway of the tests keeps it, so a served gateway goes without.
  const gateway = await startGateway(settings, { chaosEngines: process.env.SVC_ENGINE_CHAOS === '1', adminToken: admin.token, storeNestedCallCheck: false, sqlPort, sqlPasswords: sql ?? undefined, role });
  // Credentials are printed once, on the start that made them; they are kept under DATA_DIR readable by the owner only.
  const shown = [
    admin.created ? `admin token (shown once, stored in ${join(settings.dataDir, 'admin-token')}): ${admin.token}` : null,
    sql?.created ? `SQL port password for analysts (shown once, stored in ${join(settings.dataDir, 'sql-password')}): ${sql.analyst}` : null,
  ].filter((line) => line !== null);
  if (shown.length > 0) process.stderr.write(`\n${shown.join('\n')}\n\n`);
  if (role === 'worker') process.stderr.write(`svc worker working on harvest jobs (${settings.harvest.workers} at a time)\n`);
  else process.stderr.write(`svc gateway listening on ${gateway.url}${gateway.sqlPort === null ? '' : ` and SQL (read-only) on 127.0.0.1:${gateway.sqlPort}`}\n`);
  if (gateway.sqlPort !== null) {
    process.stderr.write(
      `analysts: psql "postgres://analyst@127.0.0.1:${gateway.sqlPort}/svc" with the password ${process.env.SVC_SQL_PASSWORD ? 'in SVC_SQL_PASSWORD' : `in ${join(settings.dataDir, 'sql-password')}`}; ` +
        '`svc sql` and `svc audit` read through it\n',
    );
  }
  if (!stopSignal) await new Promise<void>((resolve) => (wake = resolve));
  gateway.logger.info({ signal: stopSignal }, 'shutting down: draining in-flight requests');
  // The drain closes connections at the grace; this is the backstop should a later step hang.
  setTimeout(() => {
    process.stderr.write('svc: shutdown did not finish within the grace period; exiting\n');
    process.exit(1);
  }, settings.shutdownGraceMs + 15_000).unref();
  await gateway.close();
  return 0;
}

/** The overview's entries for `command` (an entry: its line under "commands:" and the lines indented under it). */
function overviewOf(command: string): string {
  const lines = usage.slice(usage.indexOf('commands:\n') + 'commands:\n'.length, usage.indexOf('\n\nenvironment:')).split('\n');
  const entries: string[][] = [];
  for (const line of lines) {
    if (/^ {2}\S/.test(line)) entries.push([line]);
    else entries.at(-1)?.push(line);
  }
  return entries.filter((entry) => entry[0].trim().split(/\s/)[0] === command).map((entry) => entry.join('\n')).join('\n');
}

/** A command's own usage where it has one, else its lines of the overview; null for no such command. */
async function usageOf(command: string): Promise<string | null> {
  switch (command) {
    case 'harvest':
      return (await import('./harvest.ts')).harvestUsage;
    case 'keys':
      return (await import('./keys.ts')).keysUsage;
    case 'audit':
      return (await import('./audit.ts')).auditUsage;
    case 'events':
      return (await import('./events.ts')).eventsUsage;
    case 'sql':
      return (await import('./sql.ts')).sqlUsage;
    case 'sql-role':
      return (await import('./sql.ts')).sqlRoleUsage;
  }
  const entries = overviewOf(command);
  return entries ? `usage: svc ${command} ...\n${entries}\n\n${usage.slice(usage.indexOf('\n\nenvironment:') + 2)}` : null;
}

const asksHelp = (arg: string) => arg === '--help' || arg === '-h';

async function main(argv: string[]): Promise<number> {
  const [command, ...args] = argv;
  if (command === undefined || ((command === 'help' || asksHelp(command)) && args.length === 0)) {
    process.stdout.write(`${usage}\n`);
    return command === undefined ? 2 : 0;
  }
  // `svc COMMAND ... --help` (or -h, after any subcommand and flags), or `svc help COMMAND`.
  if (command === 'help' || asksHelp(command) || args.some(asksHelp) || args[0] === 'help') {
    const named = command === 'help' || asksHelp(command) ? args[0] : command;
    const text = await usageOf(named);
    if (text === null) {
      process.stderr.write(`svc: unknown command "${named}"\n${usage}\n`);
      return 2;
    }
    process.stdout.write(text.endsWith('\n') ? text : `${text}\n`);
    return 0;
  }
  const settings = loadSettings();
  switch (command) {
    case 'serve':
      return serve(settings, args);
    case 'sql': {
      const { sqlCommand } = await import('./sql.ts');
      return sqlCommand(args, settings);
    }
    case 'sql-role': {
      const { sqlRoleCommand } = await import('./sql.ts');
      return sqlRoleCommand(args, settings);
    }
    case 'engine': {
      const { engineCommand } = await import('./engine.ts');
      return engineCommand(args, settings);
    }
    case 'worker':
      return serve(settings, args, 'worker');
    case 'harvest': {
      const { harvestCommand, harvestUsage } = await import('./harvest.ts');
      if (args.length === 0) {
        process.stdout.write(`${harvestUsage}\n`);
        return 2;
      }
      return harvestCommand(args);
    }
    case 'keys': {
      const { keysCommand, keysUsage } = await import('./keys.ts');
      if (args.length === 0) {
        process.stdout.write(`${keysUsage}\n`);
        return 2;
      }
      return keysCommand(args, settings);
    }
    case 'projections': {
      const { projectionsCommand } = await import('./projections.ts');
      if (args[0] === 'status') {
        const [{ readThroughRunningGateway }, { runProjectionsCommand }, { projections }] = await Promise.all([
          import('./read-store.ts'),
          import('../processors/index.ts'),
          import('../../projections/index.ts'),
        ]);
        const read = await readThroughRunningGateway(settings, 'projections status', (store, log) => runProjectionsCommand(args, { store, log, projections, stdout: process.stdout, stderr: process.stderr }));
        if (read !== null) return read;
      }
      return projectionsCommand(args, settings);
    }
    case 'audit': {
      const { auditCommand, runAuditCommand } = await import('./audit.ts');
      const { readThroughRunningGateway } = await import('./read-store.ts');
      const read = await readThroughRunningGateway(settings, 'audit', (store, log) => runAuditCommand(args, { store, log, stdout: process.stdout, stderr: process.stderr }));
      if (read !== null) return read;
      return auditCommand(args, settings);
    }
    case 'events': {
      const { eventsCommand, runEventsCommand } = await import('./events.ts');
      // With EventStoreDB as the log nothing of the SQL store is read: no gateway's SQL port is needed.
      if (args[0] === 'read' && settings.eventLog === 'sql') {
        const { readThroughRunningGateway } = await import('./read-store.ts');
        const read = await readThroughRunningGateway(settings, 'events read', (store) => runEventsCommand(args, { store, stdout: process.stdout, stderr: process.stderr }));
        if (read !== null) return read;
      }
      return eventsCommand(args, settings);
    }
    default:
      process.stderr.write(`svc: unknown command "${command}"\n${usage}\n`);
      return 2;
  }
}

try {
  process.exitCode = await main(process.argv.slice(2));
} catch (err) {
  if (err instanceof ConfigError || ['DataDirLocked', 'ServeBlocked', 'EventLogUnreachable'].includes((err as Error)?.name)) {
    process.stderr.write(`svc: ${(err as Error).message}\n`);
    process.exitCode = 1;
  } else {
    process.stderr.write(`svc: ${(err as Error)?.stack ?? String(err)}\n`);
    process.exitCode = 1;
  }
}
