/**
 * `svc audit statement`: a key's month as finance wants it, one line per request that ended (settled,
 * expired, rejected), recomputed from the meter events alone with the ledger's rules, then its totals
 * and, with `--by user`, a rollup per user tag. The same lines are read from `usage_ledger` at its
 * checkpoint and compared field by field: a statement that the projection does not confirm exits 1.
 */
import { internalTable, type GlobalPosition, type SqlDatabase } from '../store/index.ts';
import type { MeterEvent } from '../../events/meter.ts';
import { microsToDecimal } from '../../projections/usage-ledger.ts';

/** One request on the statement. Money is integer micro-units; `cost` is the same as an exact decimal string. */
export interface StatementLine {
  request_id: string;
  at: string;
  day: string;
  email: string | null;
  user_tag: string | null;
  model: string | null;
  outcome: 'settled' | 'expired' | 'rejected';
  status: number | null;
  code: string | null;
  input_tokens: number;
  output_tokens: number;
  basis: string | null;
  gpu_seconds: number | null;
  price_per_gpu_second_micros: number | null;
  cost_micros: number | null;
  cost: string | null;
  disconnected: boolean | null;
  /**
   * A stream cut short: the output tokens generated as far as the gateway knows (what was billed) and
   * the content frames the client's socket took; null for a stream that completed, a non-streaming
   * request, and settlements written before they were recorded (UsageSettled version 2 or earlier).
   */
  generated_output_tokens: number | null;
  relayed_output_tokens: number | null;
  /** An expired request whose settlement came late: its real usage (the charged tokens stay the expiry's). */
  late_input_tokens: number | null;
  late_output_tokens: number | null;
}

/** Tokens charged (settled and expired lines; a rejection charges none), the lines by outcome, and the cost. */
export interface StatementTotals {
  requests: number;
  settled: number;
  expired: number;
  rejected: number;
  input_tokens: number;
  output_tokens: number;
  cost_micros: number;
  cost: string;
}

export interface UserRollup extends StatementTotals {
  user_tag: string | null;
}

type Facts = { email: string; user: string | null; model: string | null };

/**
 * The statement's lines from a key's meter events of a month (in log order): the ledger's rules in
 * TypeScript. A request id's first outcome wins; an expiry takes its reservation's facts; a late
 * settlement completes its expiry's line (status, GPU time, cost, basis, real usage).
 */
export function foldStatement(events: Iterable<{ streamId: string; event: MeterEvent }>): StatementLine[] {
  const facts = new Map<string, Facts>();
  const lines = new Map<string, StatementLine>();
  const dayOf = (streamId: string) => streamId.slice(-10);
  for (const { streamId, event } of events) {
    switch (event.type) {
      case 'BudgetReserved':
        facts.set(`${streamId} ${event.data.request_id}`, { email: event.data.email, user: event.data.user, model: event.data.model });
        break;
      case 'UsageSettled':
      case 'RequestRejected': {
        const d = event.data;
        if (lines.has(d.request_id)) break;
        const settled = event.type === 'UsageSettled' ? event.data : null;
        lines.set(d.request_id, {
          request_id: d.request_id,
          at: d.at,
          day: dayOf(streamId),
          email: d.email,
          user_tag: d.user,
          model: d.model,
          outcome: settled ? 'settled' : 'rejected',
          status: d.status,
          code: settled ? null : (event.data as { code: string }).code,
          input_tokens: d.input_tokens,
          output_tokens: settled ? settled.output_tokens : 0,
          basis: settled ? settled.basis : null,
          gpu_seconds: settled ? settled.gpu_seconds : 0,
          price_per_gpu_second_micros: settled ? settled.price_per_gpu_second_micros : null,
          cost_micros: settled ? settled.cost_micros : 0,
          cost: microsToDecimal(settled ? settled.cost_micros : 0),
          disconnected: settled ? settled.disconnected : false,
          generated_output_tokens: settled ? settled.generated_output_tokens : null,
          relayed_output_tokens: settled ? settled.relayed_output_tokens : null,
          late_input_tokens: null,
          late_output_tokens: null,
        });
        break;
      }
      case 'ReservationExpired': {
        const d = event.data;
        if (lines.has(d.request_id)) break;
        const f = facts.get(`${streamId} ${d.request_id}`);
        lines.set(d.request_id, {
          request_id: d.request_id,
          at: d.at,
          day: dayOf(streamId),
          email: f?.email ?? null,
          user_tag: f?.user ?? null,
          model: f?.model ?? null,
          outcome: 'expired',
          status: null,
          code: null,
          input_tokens: d.input_tokens,
          output_tokens: d.output_tokens,
          basis: null,
          gpu_seconds: null,
          price_per_gpu_second_micros: null,
          cost_micros: null,
          cost: null,
          disconnected: null,
          relayed_output_tokens: null,
          generated_output_tokens: null,
          late_input_tokens: null,
          late_output_tokens: null,
        });
        break;
      }
      case 'LateUsageRecorded': {
        const d = event.data;
        const line = lines.get(d.request_id);
        if (!line || line.outcome !== 'expired' || line.late_input_tokens !== null) break;
        Object.assign(line, {
          status: d.status,
          basis: d.basis,
          gpu_seconds: d.gpu_seconds,
          price_per_gpu_second_micros: d.price_per_gpu_second_micros,
          cost_micros: d.cost_micros,
          cost: microsToDecimal(d.cost_micros),
          disconnected: d.disconnected,
          late_input_tokens: d.input_tokens,
          late_output_tokens: d.output_tokens,
        });
        break;
      }
      default:
        break; // no request ended
    }
  }
  return [...lines.values()].sort((a, b) => (a.at === b.at ? a.request_id.localeCompare(b.request_id) : a.at < b.at ? -1 : 1));
}

export function totalsOf(lines: readonly StatementLine[]): StatementTotals {
  const t = { requests: 0, settled: 0, expired: 0, rejected: 0, input_tokens: 0, output_tokens: 0, cost_micros: 0 };
  for (const l of lines) {
    t.requests++;
    t[l.outcome]++;
    if (l.outcome === 'rejected') continue; // its line shows the prompt's tokens; nothing was charged
    t.input_tokens += l.input_tokens;
    t.output_tokens += l.output_tokens;
    t.cost_micros += l.cost_micros ?? 0;
  }
  return { ...t, cost: microsToDecimal(t.cost_micros) };
}

export function byUser(lines: readonly StatementLine[]): UserRollup[] {
  const groups = new Map<string | null, StatementLine[]>();
  for (const l of lines) groups.set(l.user_tag, [...(groups.get(l.user_tag) ?? []), l]);
  return [...groups.entries()]
    .map(([user_tag, group]) => ({ user_tag, ...totalsOf(group) }))
    .sort((a, b) => b.cost_micros - a.cost_micros || String(a.user_tag).localeCompare(String(b.user_tag)));
}

/** The fields compared with `usage_ledger` (what finance is billed on). */
const compared = [
  'outcome',
  'day',
  'status',
  'input_tokens',
  'output_tokens',
  'basis',
  'cost_micros',
  'price_per_gpu_second_micros',
  'generated_output_tokens',
  'relayed_output_tokens',
  'late_input_tokens',
  'late_output_tokens',
] as const;

/** `usage_ledger`'s lines for the key's month and its checkpoint, from one statement (null: the projection never ran). */
export async function ledgerSide(db: SqlDatabase, key: string, month: string): Promise<{ checkpoint: GlobalPosition; lines: Map<string, Record<string, unknown>> } | null> {
  const { rows: exists } = await db.query<{ t: string | null }>(`SELECT to_regclass('usage_ledger')::text AS t`);
  if (!exists[0]?.t) return null;
  const { rows } = await db.query<Record<string, unknown>>(
    `SELECT c.transaction_id::text AS checkpoint_tx, c.global_position AS checkpoint_position, l.request_id, l.outcome, to_char(l.day, 'YYYY-MM-DD') AS day,
       l.status, l.input_tokens, l.output_tokens, l.basis, l.cost_micros, l.price_per_gpu_second_micros, l.generated_output_tokens, l.relayed_output_tokens,
       l.late_input_tokens, l.late_output_tokens
     FROM ${internalTable(db, 'projection_checkpoints')} c
     LEFT JOIN usage_ledger l ON l.key_id = $1 AND l.day >= ($2 || '-01')::date AND l.day < ($2 || '-01')::date + interval '1 month'
     WHERE c.name = 'usage_ledger'`,
    [key, month],
  );
  if (rows.length === 0) return null;
  const checkpoint = { transactionId: Number(rows[0].checkpoint_tx), position: Number(rows[0].checkpoint_position) };
  return { checkpoint, lines: new Map(rows.filter((r) => r.request_id !== null).map((r) => [String(r.request_id), r])) };
}

/** Where the statement and the ledger differ: one text per request (a field that differs, or a line one side lacks). */
export function differences(lines: readonly StatementLine[], ledger: Map<string, Record<string, unknown>>): string[] {
  const out: string[] = [];
  const norm = (v: unknown) => (v === null || v === undefined ? null : typeof v === 'number' || typeof v === 'bigint' || /^\d+$/.test(String(v)) ? Number(v) : String(v));
  for (const line of lines) {
    const row = ledger.get(line.request_id);
    if (!row) {
      out.push(`${line.request_id}: on the statement, not in usage_ledger`);
      continue;
    }
    const fields = compared.filter((f) => norm(line[f]) !== norm(row[f]));
    if (fields.length > 0) out.push(`${line.request_id}: ${fields.map((f) => `${f} statement ${String(line[f])}, usage_ledger ${String(row[f])}`).join('; ')}`);
  }
  const mine = new Set(lines.map((l) => l.request_id));
  for (const id of ledger.keys()) if (!mine.has(id)) out.push(`${id}: in usage_ledger, not on the statement`);
  return out;
}

const lineColumns = [
  'request_id',
  'at',
  'email',
  'user_tag',
  'model',
  'outcome',
  'status',
  'code',
  'input_tokens',
  'output_tokens',
  'basis',
  'gpu_seconds',
  'price_per_gpu_second_micros',
  'cost',
  'disconnected',
  'generated_output_tokens',
  'relayed_output_tokens',
  'late_input_tokens',
  'late_output_tokens',
] as const satisfies readonly (keyof StatementLine)[];

const rollupColumns = ['user_tag', 'requests', 'settled', 'expired', 'rejected', 'input_tokens', 'output_tokens', 'cost'] as const;

/**
 * A CSV cell (RFC 4180): quoted when it holds a comma, a quote or a line break; a client's text that a
 * spreadsheet would read as a formula (=, +, -, @ first) is prefixed with an apostrophe.
 */
function cell(value: unknown, clientText: boolean): string {
  if (value === null || value === undefined) return '';
  let text = String(value);
  if (clientText && /^[=+\-@\t\r]/.test(text)) text = `'${text}`;
  return /[",\r\n]/.test(text) ? `"${text.replaceAll('"', '""')}"` : text;
}

const clientColumns = new Set(['request_id', 'email', 'user_tag', 'model']);

export function statementCsv(lines: readonly StatementLine[], totals: StatementTotals, rollup: readonly UserRollup[] | null): string {
  const row = (columns: readonly string[], values: Record<string, unknown>) => columns.map((c) => cell(values[c], clientColumns.has(c))).join(',');
  if (rollup) {
    return [rollupColumns.join(','), ...rollup.map((r) => row(rollupColumns, r as unknown as Record<string, unknown>)), row(rollupColumns, { ...totals, user_tag: 'TOTAL' })].join('\r\n') + '\r\n';
  }
  const total = { request_id: 'TOTAL', outcome: `${totals.requests} requests`, input_tokens: totals.input_tokens, output_tokens: totals.output_tokens, cost: totals.cost };
  return [lineColumns.join(','), ...lines.map((l) => row(lineColumns, l as unknown as Record<string, unknown>)), row(lineColumns, total)].join('\r\n') + '\r\n';
}
