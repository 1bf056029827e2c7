/**
 * `svc audit usage --key PREFIX --month YYYY-MM [--json]`: a key's month recomputed from the event log
 * alone (its meter streams of that month, one per UTC day) next to the `key_usage` projection's rows;
 * exit 1 on any difference.
 *
 * Both sides are taken at the same place in the log: the projection's checkpoint and its rows are read
 * in one statement, and the recomputation only counts events at or before that checkpoint, so a
 * projection that is merely behind the log is not reported as wrong (it is said how far behind it is).
 */
import type { Settings } from '../config/index.ts';
import { comparePositions, formatPosition, openEventStore, type EventStore, type GlobalPosition } from '../store/index.ts';
import { meterEvents, meterStream } from '../../events/meter.ts';
import { foldKeyUsage, toUsageRow, usageCounters, type KeyUsageRow, type MeterEventOnStream } from '../../projections/key-usage.ts';

interface Output {
  write(text: string): unknown;
}

export interface AuditCommandIo {
  store: EventStore;
  stdout: Output;
  stderr: Output;
}

export const auditUsage = 'usage: svc audit usage --key PREFIX --month YYYY-MM [--json]\n';

interface PeriodComparison {
  period_kind: 'month' | 'day';
  period: string;
  log: KeyUsageRow | null;
  projection: KeyUsageRow | null;
  /** Counters that differ (every counter when one side has no row). */
  differs: string[];
}

function parseArgs(args: readonly string[]): { key: string; month: string; json: boolean } | string {
  if (args[0] !== 'usage') return 'unknown audit';
  let key: string | undefined;
  let month: string | undefined;
  let json = false;
  for (let i = 1; i < args.length; i++) {
    const [flag, inline] = args[i].split('=', 2);
    if (flag === '--json') json = true;
    else if (flag === '--key' || flag === '--month') {
      const value = inline ?? args[++i];
      if (value === undefined) return `${flag} needs a value`;
      if (flag === '--key') key = value;
      else month = value;
    } else return `unexpected argument "${args[i]}"`;
  }
  if (!key) return '--key PREFIX is required';
  // A full key is never wanted here (nor echoed): the prefix identifies it.
  if (key.startsWith('svc_')) return '--key takes the key prefix (12 hex characters), not the key itself';
  if (!month || !/^\d{4}-(0[1-9]|1[0-2])$/.test(month)) return '--month YYYY-MM is required';
  return { key, month, json };
}

function daysOf(month: string): string[] {
  const [year, m] = month.split('-').map(Number);
  const count = new Date(Date.UTC(year, m, 0)).getUTCDate();
  return Array.from({ length: count }, (_, i) => `${month}-${String(i + 1).padStart(2, '0')}`);
}

/** The projection's rows for the key's month and its checkpoint, from one snapshot. */
async function projectionSide(store: EventStore, key: string, month: string): Promise<{ checkpoint: GlobalPosition; rows: KeyUsageRow[] } | null> {
  const { rows: exists } = await store.query<{ t: string | null }>(`SELECT to_regclass('key_usage')::text AS t`);
  if (!exists[0]?.t) return null;
  const { rows } = await store.query<Record<string, unknown>>(
    `SELECT c.transaction_id::text AS checkpoint_tx, c.global_position AS checkpoint_position, u.*
     FROM projection_checkpoints c
     LEFT JOIN key_usage u ON u.key_id = $1 AND ((u.period_kind = 'month' AND u.period = $2) OR (u.period_kind = 'day' AND u.period LIKE $2 || '-%'))
     WHERE c.name = 'key_usage'`,
    [key, month],
  );
  if (rows.length === 0) return null;
  const checkpoint = { transactionId: Number(rows[0].checkpoint_tx), position: Number(rows[0].checkpoint_position) };
  return { checkpoint, rows: rows.filter((r) => r.key_id !== null).map(toUsageRow) };
}

/** Recomputes the month from the key's meter streams, counting only events at or before `upTo`. */
async function logSide(store: EventStore, key: string, month: string, upTo: GlobalPosition): Promise<{ rows: KeyUsageRow[]; events: number; streams: number }> {
  const events: MeterEventOnStream[] = [];
  let streams = 0;
  for (const day of daysOf(month)) {
    const streamId = meterStream(key, day);
    const pageSize = 10_000;
    for (let from = 1; ; from += pageSize) {
      const { events: page } = await store.readStream(streamId, { fromVersion: from, limit: pageSize });
      if (from === 1 && page.length > 0) streams++;
      for (const stored of page) {
        if (comparePositions(stored.globalPosition, upTo) > 0) continue;
        // Checked and upcast by the meter catalogue, as the projection sees them.
        const event = meterEvents.parse(stored);
        events.push({ streamId, type: event.type, data: event.data });
      }
      if (page.length < pageSize) break;
    }
  }
  return { rows: [...foldKeyUsage(events).values()], events: events.length, streams };
}

function compare(log: readonly KeyUsageRow[], projection: readonly KeyUsageRow[]): PeriodComparison[] {
  const id = (r: KeyUsageRow) => `${r.period_kind}|${r.period}`;
  const byLog = new Map(log.map((r) => [id(r), r]));
  const byProjection = new Map(projection.map((r) => [id(r), r]));
  const ids = [...new Set([...byLog.keys(), ...byProjection.keys()])].sort((a, b) => (a.startsWith('month') === b.startsWith('month') ? a.localeCompare(b) : a.startsWith('month') ? -1 : 1));
  return ids.map((key) => {
    const l = byLog.get(key) ?? null;
    const p = byProjection.get(key) ?? null;
    const [kind, period] = key.split('|') as ['month' | 'day', string];
    const differs = l && p ? usageCounters.filter((c) => l[c] !== p[c]) : [...usageCounters];
    return { period_kind: kind, period, log: l, projection: p, differs };
  });
}

function table(comparisons: readonly PeriodComparison[]): string {
  const header = ['period', 'source', ...usageCounters.map((c) => c.replace('_tokens', '')), 'differs'];
  const lines: string[][] = [header];
  for (const c of comparisons) {
    const cells = (row: KeyUsageRow | null) => usageCounters.map((counter) => (row ? String(row[counter]) : '-'));
    lines.push([c.period, 'log', ...cells(c.log), c.log ? '' : 'no row in the log']);
    lines.push(['', 'projection', ...cells(c.projection), c.projection ? (c.differs.length > 0 ? `<- ${c.differs.join(', ')}` : '') : '<- no row in key_usage']);
  }
  const widths = header.map((_, i) => Math.max(...lines.map((l) => l[i].length)));
  return lines.map((l) => l.map((cell, i) => (i >= 2 && i < header.length - 1 ? cell.padStart(widths[i]) : cell.padEnd(widths[i]))).join('  ').trimEnd()).join('\n');
}

/** Runs `svc audit ...`; returns the exit code: 0 agree, 1 differ, 2 usage or nothing to audit. */
export async function runAuditCommand(args: readonly string[], io: AuditCommandIo): Promise<number> {
  const parsed = parseArgs(args);
  if (typeof parsed === 'string') {
    io.stderr.write(`svc audit: ${parsed}\n${auditUsage}`);
    return 2;
  }
  const { key, month, json } = parsed;
  const projection = await projectionSide(io.store, key, month);
  if (!projection) {
    io.stderr.write('svc audit: the key_usage projection has not run on this store yet (start the server, or run: svc projections rebuild key_usage)\n');
    return 2;
  }
  const log = await logSide(io.store, key, month, projection.checkpoint);
  const behind = await io.store.countAfter(projection.checkpoint);
  const comparisons = compare(log.rows, projection.rows);
  const differing = comparisons.filter((c) => c.differs.length > 0);
  if (json) {
    io.stdout.write(
      `${JSON.stringify({ key_id: key, month, checkpoint: formatPosition(projection.checkpoint), events_behind: behind, log_events: log.events, agree: differing.length === 0, periods: comparisons })}\n`,
    );
    return differing.length === 0 ? 0 : 1;
  }
  io.stdout.write(
    `key ${key}, ${month}: ${log.events} meter events on ${log.streams} day stream(s), up to key_usage's checkpoint ${formatPosition(projection.checkpoint)}` +
      `${behind > 0 ? ` (the projection is ${behind} event(s) behind the log; later events are left out of both sides)` : ''}\n\n`,
  );
  if (comparisons.length === 0) io.stdout.write('no usage in this month, in the log or in key_usage\n');
  else io.stdout.write(`${table(comparisons)}\n\n`);
  io.stdout.write(
    differing.length === 0
      ? `agree: ${comparisons.length} period(s), log and key_usage match\n`
      : `DIFFER: ${differing.length} of ${comparisons.length} period(s): ${differing.map((c) => c.period).join(', ')}\n`,
  );
  return differing.length === 0 ? 0 : 1;
}

/** `svc audit ...` from the command line: opens the store as the server would. */
export async function auditCommand(args: string[], settings: Settings): Promise<number> {
  const parsed = parseArgs(args);
  if (typeof parsed === 'string') {
    process.stderr.write(`svc audit: ${parsed}\n${auditUsage}`);
    return 2;
  }
  // With the embedded store, a running server holds DATA_DIR: opening fails with DataDirLocked, which says so.
  const store = await openEventStore({ databaseUrl: settings.databaseUrl, dataDir: settings.dataDir, purpose: `svc audit ${args.join(' ')}` });
  try {
    return await runAuditCommand(args, { store, stdout: process.stdout, stderr: process.stderr });
  } finally {
    await store.close();
  }
}
