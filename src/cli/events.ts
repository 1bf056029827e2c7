/**
 * `svc events read STREAM [--json]` and `svc events tail [--json] [--from POSITION|start]`: the log as
 * an auditor reads it, stored data as it is (no upcasting, no schema check), metadata included.
 * Readable text by default; `--json` writes one JSON object per line (NDJSON) for scripts.
 */
import type { Settings } from '../config/index.ts';
import { formatPosition, logStart, openEventStore, type EventLog, type GlobalPosition, type RecordedEvent } from '../store/index.ts';
import { openConfiguredEventLog } from '../gateway/event-log.ts';

interface Output {
  write(text: string): unknown;
}

export interface EventsCommandIo {
  /** The event log: the SQL store's, or EventStoreDB's (SVC_EVENT_LOG=eventstoredb). */
  store: EventLog;
  stdout: Output;
  stderr: Output;
  /** Stops `tail` (SIGINT / SIGTERM from the command line). */
  signal?: AbortSignal;
  /** Told once `tail` reads live (tests wait for it instead of sleeping). */
  onFollowing?(from: GlobalPosition): void;
}

export const eventsUsage = `usage: svc events read STREAM [--json]
       svc events tail [--json] [--from POSITION|start]   (POSITION as printed: TRANSACTION/POSITION; default: the head)
`;

function asJson(e: RecordedEvent): string {
  return JSON.stringify({
    stream_id: e.streamId,
    version: e.streamVersion,
    type: e.type,
    recorded_at: e.recordedAt.toISOString(),
    global_position: formatPosition(e.globalPosition),
    event_id: e.id,
    data: e.data,
    metadata: e.metadata,
  });
}

function asText(e: RecordedEvent, withStream: boolean): string {
  const where = withStream ? `${formatPosition(e.globalPosition)}  ${e.streamId}@${e.streamVersion}` : `#${e.streamVersion}  ${formatPosition(e.globalPosition)}`;
  return `${where}  ${e.recordedAt.toISOString()}  ${e.type}\n    data      ${JSON.stringify(e.data)}\n    metadata  ${JSON.stringify(e.metadata)}\n`;
}

function parsePosition(text: string): GlobalPosition | null {
  if (text === 'start') return logStart;
  const match = /^(\d+)\/(\d+)$/.exec(text);
  return match ? { transactionId: Number(match[1]), position: Number(match[2]) } : null;
}

async function read(args: readonly string[], io: EventsCommandIo): Promise<number> {
  const json = args.includes('--json');
  const rest = args.filter((a) => a !== '--json');
  if (rest.length !== 1 || rest[0].startsWith('--')) {
    io.stderr.write(eventsUsage);
    return 2;
  }
  const streamId = rest[0];
  const pageSize = 1000;
  let shown = 0;
  for (let from = 1; ; from += pageSize) {
    const { version, events } = await io.store.readStream(streamId, { fromVersion: from, limit: pageSize });
    if (from === 1) {
      if (version === 0) {
        io.stderr.write(`svc events: stream ${streamId} has no events\n`);
        return 1;
      }
      if (!json) io.stdout.write(`${streamId}: version ${version}\n\n`);
    }
    for (const e of events) io.stdout.write(json ? `${asJson(e)}\n` : asText(e, false));
    shown += events.length;
    if (events.length < pageSize) break;
  }
  return shown > 0 ? 0 : 1;
}

async function tail(args: readonly string[], io: EventsCommandIo): Promise<number> {
  let json = false;
  let from: GlobalPosition | null = null;
  for (let i = 0; i < args.length; i++) {
    const [flag, inline] = args[i].split('=', 2);
    if (flag === '--json') json = true;
    else if (flag === '--from') {
      from = parsePosition(inline ?? args[++i] ?? '');
      if (!from) {
        io.stderr.write(`svc events: --from takes a position such as 1234/5678 (as printed) or "start"\n${eventsUsage}`);
        return 2;
      }
    } else {
      io.stderr.write(`svc events: unexpected argument "${args[i]}"\n${eventsUsage}`);
      return 2;
    }
  }
  if (io.signal?.aborted) return 0;
  const after = from ?? (await io.store.head());
  if (!json) io.stderr.write(`following the event log after ${formatPosition(after)} (Ctrl-C to stop)\n`);
  const subscription = io.store.subscribe({
    after,
    handle: async (events) => {
      for (const e of events) io.stdout.write(json ? `${asJson(e)}\n` : asText(e, true));
    },
    onError: (error) => io.stderr.write(`svc events: reading the log failed, retrying: ${(error as Error).message}\n`),
  });
  io.onFollowing?.(after);
  await new Promise<void>((resolve) => {
    if (io.signal?.aborted) return resolve();
    io.signal?.addEventListener('abort', () => resolve(), { once: true });
  });
  await subscription.stop();
  return 0;
}

/** Runs one `svc events ...` command; returns the process exit code. */
export async function runEventsCommand(args: readonly string[], io: EventsCommandIo): Promise<number> {
  const [action, ...rest] = args;
  if (action === 'read') return read(rest, io);
  if (action === 'tail') return tail(rest, io);
  io.stderr.write(eventsUsage);
  return 2;
}

/** `svc events ...` from the command line: opens the store as the server would; tail runs until SIGINT/SIGTERM. */
export async function eventsCommand(args: string[], settings: Settings): Promise<number> {
  if (args[0] !== 'read' && args[0] !== 'tail') {
    process.stderr.write(eventsUsage);
    return 2;
  }
  // Only the log is read: EventStoreDB's when configured, no SQL store then. With the embedded store, a
  // running server holds DATA_DIR: opening fails with DataDirLocked, which says so.
  const store: EventLog =
    (await openConfiguredEventLog(settings)) ?? (await openEventStore({ databaseUrl: settings.databaseUrl, dataDir: settings.dataDir, purpose: `svc events ${args.join(' ')}` }));
  const stop = new AbortController();
  const onSignal = () => stop.abort();
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  // `svc events tail | head` closes the pipe: stop quietly.
  process.stdout.on('error', (error: NodeJS.ErrnoException) => (error.code === 'EPIPE' ? stop.abort() : undefined));
  try {
    return await runEventsCommand(args, { store, stdout: process.stdout, stderr: process.stderr, signal: stop.signal });
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    await store.close();
  }
}
