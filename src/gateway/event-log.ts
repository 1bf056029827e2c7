/**
 * The event log a process is configured with (SVC_EVENT_LOG): the SQL store's own (`sql`, nothing to
 * open here), or EventStoreDB/KurrentDB's at EVENTSTORE_URL (`eventstoredb`), opened beside the SQL
 * store that keeps the rows, checkpoints and leases. `svc serve`, `svc worker` and the CLI's
 * read commands open it the same way.
 */
import type { Settings } from '../config/index.ts';
import { openEventStoreDbLog, type EventStoreDbLog } from '../store/index.ts';

/** The configured event log cannot be opened: `message` is one line for the operator, naming EVENTSTORE_URL. */
export class EventLogUnreachable extends Error {
  override name = 'EventLogUnreachable';
}

/** The connection string without its password (a credential: never logged). */
export function redactedEventStoreUrl(url: string): string {
  return url.replace(/\/\/([^@/?]*?):[^@/?]*@/, '//$1:***@');
}

/**
 * Opens EventStoreDB's log when the settings say so (null: the log is the SQL store's). It reads the
 * log's end once, so a server that does not answer stops the start here, in one line.
 */
export async function openConfiguredEventLog(
  settings: Pick<Settings, 'eventLog' | 'eventStoreUrl'>,
  options: { onAppend?: (ms: number) => void } = {},
): Promise<EventStoreDbLog | null> {
  if (settings.eventLog !== 'eventstoredb') return null;
  const url = settings.eventStoreUrl;
  if (!url) throw new EventLogUnreachable('SVC_EVENT_LOG=eventstoredb needs EVENTSTORE_URL');
  try {
    return await openEventStoreDbLog({ url, onAppend: options.onAppend });
  } catch (error) {
    const password = /\/\/[^@/?]*?:([^@/?]*)@/.exec(url)?.[1];
    // gRPC ends its message with an empty "Resolution note:".
    const reason = String((error as Error)?.message ?? error).replace(/\s+/g, ' ').replace(/\s*Resolution note:\s*$/, '').replace(/[.\s]+$/, '');
    throw new EventLogUnreachable(
      `the event log (SVC_EVENT_LOG=eventstoredb) cannot be opened at EVENTSTORE_URL ${redactedEventStoreUrl(url)}: ` +
        `${password ? reason.split(password).join('***') : reason}; start the server, or correct EVENTSTORE_URL`,
      { cause: error },
    );
  }
}
