/**
 * `svc audit usage --key PREFIX [--month YYYY-MM] [--json]`: a key's month (the current UTC month by
 * default) recomputed from the event log alone (its key stream for the owner and budgets, its meter
 * streams of that month, one per UTC day) next to the `key_usage` projection's rows; exit 1 on any
 * difference. `svc audit statement` (./audit-statement.ts): the month's requests, for finance.
 *
 * Both sides are taken at the same place in the log: the projection's checkpoint and its rows are read
 * in one statement, and the recomputation only counts events at or before that checkpoint, so a
 * projection that is merely behind the log is not reported as wrong (it is said how far behind it is).
 */
import type { Settings } from '../config/index.ts';
import { comparePositions, formatPosition, internalTable, openEventStore, type EventLog, type EventStore, type GlobalPosition } from '../store/index.ts';
import { withEventLog } from './read-store.ts';
import { meterEvents, meterStream, type MeterEvent } from '../../events/meter.ts';
import { keyEvents, keyStream, type KeyEvent } from '../../events/key.ts';
import { daysOfMonth, utcMonth } from '../../events/shapes.ts';
import { keyDecider, type KeyState } from '../../deciders/key.ts';
import { byUser, differences, foldStatement, ledgerSide, statementCsv, totalsOf } from './audit-statement.ts';
import { foldKeyUsage, toUsageRow, usageCounters, type KeyUsageRow } from '../../projections/key-usage.ts';

interface Output {
  write(text: string): unknown;
}

export interface AuditCommandIo {
  /** The SQL store: the projections' rows and checkpoints (and the log, unless `log` is given). */
  store: EventStore;
  /** The event log when it is not the store's (EventStoreDB's, SVC_EVENT_LOG=eventstoredb). */
  log?: EventLog;
  stdout: Output;
  stderr: Output;
  /** The clock that picks the default month (tests pass one). */
  now?: () => Date;
}

export const auditUsage =
  'usage: svc audit usage --key PREFIX [--month YYYY-MM] [--json]\n' +
  '       svc audit statement --key PREFIX [--month YYYY-MM] [--format csv|json] [--by user]\n' +
  '       (--month: the current UTC month by default)\n';

interface PeriodComparison {
  period_kind: 'month' | 'day';
  period: string;
  log: KeyUsageRow | null;
  projection: KeyUsageRow | null;
  /** Counters that differ (every counter when one side has no row). */
  differs: string[];
}

interface AuditArgs {
  command: 'usage' | 'statement';
  key: string;
  /** Undefined: the current UTC month. */
  month: string | undefined;
  json: boolean;
  format: 'csv' | 'json';
  byUser: boolean;
}

function parseArgs(args: readonly string[]): AuditArgs | string {
  const command = args[0];
  if (command !== 'usage' && command !== 'statement') return 'unknown audit';
  const parsed: AuditArgs = { command, key: '', month: undefined, json: false, format: 'csv', byUser: false };
  for (let i = 1; i < args.length; i++) {
    const [flag, inline] = args[i].split('=', 2);
    if (flag === '--json' && command === 'usage') parsed.json = true;
    else if (flag === '--key' || flag === '--month' || (command === 'statement' && (flag === '--format' || flag === '--by'))) {
      const value = inline ?? args[++i];
      if (value === undefined) return `${flag} needs a value`;
      if (flag === '--key') parsed.key = value;
      else if (flag === '--month') parsed.month = value;
      else if (flag === '--format') {
        if (value !== 'csv' && value !== 'json') return '--format is csv or json';
        parsed.format = value;
      } else if (value === 'user') parsed.byUser = true;
      else return '--by takes user';
    } else return `unexpected argument "${args[i]}"`;
  }
  if (!parsed.key) return '--key PREFIX is required';
  // A full key is never wanted here (nor echoed): the prefix identifies it.
  if (parsed.key.startsWith('svc_')) return '--key takes the key prefix (12 hex characters), not the key itself';
  if (parsed.month !== undefined && !/^\d{4}-(0[1-9]|1[0-2])$/.test(parsed.month)) return '--month takes YYYY-MM';
  return parsed;
}

/** The projection's rows for the key's month and its checkpoint, from one snapshot. */
async function projectionSide(store: EventStore, key: string, month: string): Promise<{ checkpoint: GlobalPosition; rows: KeyUsageRow[] } | null> {
  const { rows: exists } = await store.query<{ t: string | null }>(`SELECT to_regclass('key_usage')::text AS t`);
  if (!exists[0]?.t) return null;
  const { rows } = await store.query<Record<string, unknown>>(
    `SELECT c.transaction_id::text AS checkpoint_tx, c.global_position AS checkpoint_position, u.*
     FROM ${internalTable(store, 'projection_checkpoints')} c
     LEFT JOIN key_usage u ON u.key_id = $1 AND u.period_start >= ($2 || '-01')::date AND u.period_start < ($2 || '-01')::date + interval '1 month'
     WHERE c.name = 'key_usage'`,
    [key, month],
  );
  if (rows.length === 0) return null;
  const checkpoint = { transactionId: Number(rows[0].checkpoint_tx), position: Number(rows[0].checkpoint_position) };
  return { checkpoint, rows: rows.filter((r) => r.key_id !== null).map(toUsageRow) };
}

/** The key's meter events of the month, checked and upcast by the meter catalogue (as the projections see them), up to `upTo`. */
async function meterEventsOfMonth(log: EventLog, key: string, month: string, upTo: GlobalPosition): Promise<{ events: { streamId: string; event: MeterEvent }[]; streams: number }> {
  const events: { streamId: string; event: MeterEvent }[] = [];
  let streams = 0;
  for (const day of daysOfMonth(month)) {
    const streamId = meterStream(key, day);
    const pageSize = 10_000;
    for (let from = 1; ; from += pageSize) {
      const { events: page } = await log.readStream(streamId, { fromVersion: from, limit: pageSize });
      if (from === 1 && page.length > 0) streams++;
      for (const stored of page) {
        if (comparePositions(stored.globalPosition, upTo) > 0) continue;
        events.push({ streamId, event: meterEvents.parse(stored) as MeterEvent });
      }
      if (page.length < pageSize) break;
    }
  }
  return { events, streams };
}

/** Tokens charged in the month by how: settled (the engine's or the relay's count), by expiry (the whole hold), and late settlements' real usage. */
interface ChargedTokens {
  settled: { requests: number; input_tokens: number; output_tokens: number };
  expired: { requests: number; input_tokens: number; output_tokens: number };
  late: { requests: number; input_tokens: number; output_tokens: number };
}

function chargedTokens(events: readonly { event: MeterEvent }[]): ChargedTokens {
  const charged: ChargedTokens = {
    settled: { requests: 0, input_tokens: 0, output_tokens: 0 },
    expired: { requests: 0, input_tokens: 0, output_tokens: 0 },
    late: { requests: 0, input_tokens: 0, output_tokens: 0 },
  };
  for (const { event } of events) {
    const bucket = event.type === 'UsageSettled' ? charged.settled : event.type === 'ReservationExpired' ? charged.expired : event.type === 'LateUsageRecorded' ? charged.late : null;
    if (!bucket) continue;
    const d = event.data as { input_tokens: number; output_tokens: number };
    bucket.requests++;
    bucket.input_tokens += d.input_tokens;
    bucket.output_tokens += d.output_tokens;
  }
  return charged;
}

/** The key as its stream says (owner, status, budgets now); null: no such key in the log. */
async function keyOf(log: EventLog, key: string): Promise<Exclude<KeyState, { status: 'none' }> | null> {
  const { events } = await log.readStream(keyStream(key), { fromVersion: 1 });
  let state: KeyState = keyDecider.initialState();
  for (const stored of events) state = keyDecider.evolve(state, keyEvents.parse(stored) as KeyEvent);
  return state.status === 'none' ? null : state;
}

const budgetNames = ['monthly_token_budget', 'daily_token_budget', 'monthly_input_token_budget', 'monthly_output_token_budget', 'monthly_harvest_jobs'] as const;

function budgetsLine(budgets: Owner['budgets']): string {
  return budgetNames.map((name) => `${name} ${budgets[name] ?? 'unlimited'}`).join(', ');
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

/**
 * Runs `svc audit ...`; returns the exit code: 0 agree, 1 differ, 2 usage, an unknown key or nothing
 * to audit (the projection never ran).
 */
export async function runAuditCommand(args: readonly string[], io: AuditCommandIo): Promise<number> {
  const parsed = parseArgs(args);
  if (typeof parsed === 'string') {
    io.stderr.write(`svc audit: ${parsed}\n${auditUsage}`);
    return 2;
  }
  const month = parsed.month ?? utcMonth(io.now?.() ?? new Date());
  const owner = await keyOf(io.log ?? io.store, parsed.key);
  if (!owner) {
    io.stderr.write(`svc audit: unknown key ${parsed.key} (no key stream ${keyStream(parsed.key)} in the log)\n`);
    return 2;
  }
  return parsed.command === 'usage' ? auditUsageOf(io, parsed, month, owner) : auditStatementOf(io, parsed, month, owner);
}

type Owner = Exclude<KeyState, { status: 'none' }>;

async function auditUsageOf(io: AuditCommandIo, { key, json }: AuditArgs, month: string, owner: Owner): Promise<number> {
  const projection = await projectionSide(io.store, key, month);
  if (!projection) {
    io.stderr.write('svc audit: the key_usage projection has not run on this store yet (start the server, or run: svc projections rebuild key_usage)\n');
    return 2;
  }
  const { events, streams } = await meterEventsOfMonth(io.log ?? io.store, key, month, projection.checkpoint);
  const log = { rows: [...foldKeyUsage(events.map(({ streamId, event }) => ({ streamId, type: event.type, data: event.data }))).values()], events: events.length, streams };
  const charged = chargedTokens(events);
  const behind = await (io.log ?? io.store).countAfter(projection.checkpoint);
  const comparisons = compare(log.rows, projection.rows);
  const differing = comparisons.filter((c) => c.differs.length > 0);
  if (json) {
    io.stdout.write(
      `${JSON.stringify({
        key_id: key,
        month,
        owner: { email: owner.email, user_id: owner.userId, status: owner.status },
        budgets: owner.budgets,
        checkpoint: formatPosition(projection.checkpoint),
        events_behind: behind,
        log_events: log.events,
        charged,
        agree: differing.length === 0,
        periods: comparisons,
      })}\n`,
    );
    return differing.length === 0 ? 0 : 1;
  }
  io.stdout.write(
    `key ${key}, ${month}: owner ${owner.email} (user ${owner.userId}), ${owner.status}\n` +
      `budgets now: ${budgetsLine(owner.budgets)}\n` +
      `${log.events} meter events on ${log.streams} day stream(s), up to key_usage's checkpoint ${formatPosition(projection.checkpoint)}` +
      `${behind > 0 ? ` (the projection is ${behind} event(s) behind the log; later events are left out of both sides)` : ''}\n` +
      `charged: settled ${charged.settled.input_tokens} in / ${charged.settled.output_tokens} out (${charged.settled.requests} requests); ` +
      `by expiry ${charged.expired.input_tokens} in / ${charged.expired.output_tokens} out (${charged.expired.requests} holds, the whole hold each)` +
      `${charged.late.requests > 0 ? `; late settlements after an expiry (not charged again) ${charged.late.input_tokens} in / ${charged.late.output_tokens} out (${charged.late.requests})` : ''}\n\n`,
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

/**
 * The statement, from the log up to usage_ledger's checkpoint, on stdout; where it and usage_ledger
 * differ, on stderr, and exit 1.
 */
async function auditStatementOf(io: AuditCommandIo, { key, format, byUser: rollup }: AuditArgs, month: string, owner: Owner): Promise<number> {
  const ledger = await ledgerSide(io.store, key, month);
  if (!ledger) {
    io.stderr.write('svc audit: the usage_ledger projection has not run on this store yet (start the server, or run: svc projections rebuild usage_ledger)\n');
    return 2;
  }
  const { events } = await meterEventsOfMonth(io.log ?? io.store, key, month, ledger.checkpoint);
  const lines = foldStatement(events);
  const totals = totalsOf(lines);
  const users = rollup ? byUser(lines) : null;
  const differ = differences(lines, ledger.lines);
  if (format === 'json') {
    io.stdout.write(
      `${JSON.stringify({
        key_id: key,
        month,
        owner: { email: owner.email, user_id: owner.userId },
        checkpoint: formatPosition(ledger.checkpoint),
        ...(users ? { by_user: users } : { lines }),
        totals,
        agree: differ.length === 0,
        differences: differ,
      })}\n`,
    );
  } else io.stdout.write(statementCsv(lines, totals, users));
  if (differ.length > 0) {
    io.stderr.write(`svc audit: the statement and usage_ledger DIFFER on ${differ.length} request(s):\n${differ.map((d) => `  ${d}\n`).join('')}`);
    return 1;
  }
  io.stderr.write(`agree: ${totals.requests} request(s), cost ${totals.cost}; the statement and usage_ledger match\n`);
  return 0;
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
    return await withEventLog(settings, store, (log) => runAuditCommand(args, { store, log, stdout: process.stdout, stderr: process.stderr }));
  } finally {
    await store.close();
  }
}
