/**
 * `svc keys create|list|show|pause|resume|revoke|set-budget`: the admin API of a running gateway over
 * HTTP (SVC_URL, default http://127.0.0.1:8080), with the admin token from SVC_ADMIN_TOKEN or the
 * local DATA_DIR's admin-token file. A table by default, `--json` for scripts.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Settings } from '../config/index.ts';
import { parseArgs, UsageError, type ParsedArgs } from './args.ts';

export const keysUsage = `usage: svc keys <command> [options]

  create --email E [--user-id U] [budgets]   issue a key (the full key is printed once)
  list                                       every key with its usage this UTC month
  show PREFIX                                one key with its usage this UTC month
  pause PREFIX | resume PREFIX | revoke PREFIX
  set-budget PREFIX [budgets]                change budgets ("none" = unlimited)

budgets: --monthly-token-budget N  --daily-token-budget N  --monthly-input-token-budget N
         --monthly-output-token-budget N  --monthly-harvest-jobs N     (N: tokens/jobs, or "none")
options: --json (machine-readable output)
environment: SVC_URL (http://127.0.0.1:8080), SVC_ADMIN_TOKEN (default: DATA_DIR/admin-token)`;

const budgetFlags = {
  '--monthly-token-budget': 'monthly_token_budget',
  '--daily-token-budget': 'daily_token_budget',
  '--monthly-input-token-budget': 'monthly_input_token_budget',
  '--monthly-output-token-budget': 'monthly_output_token_budget',
  '--monthly-harvest-jobs': 'monthly_harvest_jobs',
} as const;


export interface KeysIo {
  env: NodeJS.ProcessEnv;
  stdout: { write(text: string): unknown };
  stderr: { write(text: string): unknown };
}


function budgetsFrom(flags: Map<string, string>, allowed: Set<string>): Record<string, number | null> {
  const budgets: Record<string, number | null> = {};
  for (const [flag, value] of flags) {
    if (!allowed.has(flag)) throw new UsageError(`unknown option ${flag}`);
    const field = budgetFlags[flag as keyof typeof budgetFlags];
    if (!field) continue;
    if (value === 'none' || value === 'unlimited' || value === 'null') budgets[field] = null;
    else if (/^\d+$/.test(value) && Number.isSafeInteger(Number(value))) budgets[field] = Number(value);
    else throw new UsageError(`${flag} must be a non-negative integer or "none", not "${value}"`);
  }
  return budgets;
}

function adminToken(env: NodeJS.ProcessEnv, dataDir: string): string {
  if (env.SVC_ADMIN_TOKEN) return env.SVC_ADMIN_TOKEN;
  const file = join(dataDir, 'admin-token');
  if (!existsSync(file)) throw new Error(`no admin token: set SVC_ADMIN_TOKEN, or run this where the gateway's DATA_DIR is (${file} does not exist)`);
  return readFileSync(file, 'utf8').trim();
}

const fmtBudget = (v: unknown) => (v === null || v === undefined ? '-' : String(v));

function table(rows: string[][]): string {
  const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
  return rows.map((r) => r.map((cell, c) => cell.padEnd(widths[c])).join('  ').trimEnd()).join('\n') + '\n';
}

function keyTable(keys: any[]): string {
  const header = ['PREFIX', 'STATUS', 'EMAIL', 'USER', 'MONTH', 'USED', 'RESERVED', 'MONTHLY', 'DAILY', 'INPUT', 'OUTPUT', 'HARVESTS', 'ISSUED'];
  const rows = keys.map((k) => [
    k.prefix,
    k.status,
    k.email,
    k.user_id,
    k.usage?.period ?? '',
    k.usage ? String(k.usage.total_tokens) : '',
    k.usage ? String(k.usage.reserved_tokens) : '',
    fmtBudget(k.monthly_token_budget),
    fmtBudget(k.daily_token_budget),
    fmtBudget(k.monthly_input_token_budget),
    fmtBudget(k.monthly_output_token_budget),
    fmtBudget(k.monthly_harvest_jobs),
    k.issued_at,
  ]);
  return table([header, ...rows]);
}

function details(k: any): string {
  const lines: [string, string][] = [
    ['prefix', k.prefix],
    ['status', k.status],
    ['email', k.email],
    ['user_id', k.user_id],
    ['monthly_token_budget', fmtBudget(k.monthly_token_budget)],
    ['daily_token_budget', fmtBudget(k.daily_token_budget)],
    ['monthly_input_token_budget', fmtBudget(k.monthly_input_token_budget)],
    ['monthly_output_token_budget', fmtBudget(k.monthly_output_token_budget)],
    ['monthly_harvest_jobs', fmtBudget(k.monthly_harvest_jobs)],
    ['issued_at', k.issued_at],
  ];
  if (k.usage) {
    const u = k.usage;
    lines.push([`usage ${u.period}`, `${u.total_tokens} tokens (${u.input_tokens} in, ${u.output_tokens} out), ${u.reserved_tokens} reserved, ${u.requests} requests`]);
  }
  const width = Math.max(...lines.map(([name]) => name.length));
  return lines.map(([name, value]) => `${name.padEnd(width)}  ${value}`).join('\n') + '\n';
}

export async function keysCommand(args: string[], settings: Pick<Settings, 'dataDir'>, io: KeysIo = { env: process.env, stdout: process.stdout, stderr: process.stderr }): Promise<number> {
  const [command, ...rest] = args;
  let parsed: ParsedArgs;
  let request: { method: string; path: string; body?: unknown };
  try {
    parsed = parseArgs(rest);
    const prefix = () => {
      if (parsed.positional.length !== 1) throw new UsageError(`svc keys ${command} needs one PREFIX`);
      return encodeURIComponent(parsed.positional[0]);
    };
    const noFlags = () => {
      const flag = parsed.flags.keys().next().value;
      if (flag) throw new UsageError(`unknown option ${flag}`);
    };
    switch (command) {
      case 'create': {
        if (parsed.positional.length > 0) throw new UsageError(`unexpected argument ${parsed.positional[0]}`);
        const email = parsed.flags.get('--email');
        if (!email) throw new UsageError('svc keys create needs --email');
        const userId = parsed.flags.get('--user-id');
        const budgets = budgetsFrom(parsed.flags, new Set(['--email', '--user-id', ...Object.keys(budgetFlags)]));
        request = { method: 'POST', path: '/admin/keys', body: { email, ...(userId ? { user_id: userId } : {}), ...budgets } };
        break;
      }
      case 'list':
        noFlags();
        if (parsed.positional.length > 0) throw new UsageError(`unexpected argument ${parsed.positional[0]}`);
        request = { method: 'GET', path: '/admin/keys' };
        break;
      case 'show':
        noFlags();
        request = { method: 'GET', path: `/admin/keys/${prefix()}` };
        break;
      case 'pause':
      case 'resume':
      case 'revoke':
        noFlags();
        request = { method: 'POST', path: `/admin/keys/${prefix()}/${command}` };
        break;
      case 'set-budget': {
        const p = prefix();
        const budgets = budgetsFrom(parsed.flags, new Set(Object.keys(budgetFlags)));
        if (Object.keys(budgets).length === 0) throw new UsageError('svc keys set-budget needs at least one budget option');
        request = { method: 'PATCH', path: `/admin/keys/${p}`, body: budgets };
        break;
      }
      default:
        throw new UsageError(command ? `unknown keys command "${command}"` : 'a keys command is needed');
    }
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    io.stderr.write(`svc keys: ${err.message}\n${keysUsage}\n`);
    return 2;
  }

  const base = (io.env.SVC_URL || 'http://127.0.0.1:8080').replace(/\/+$/, '');
  let token: string;
  try {
    token = adminToken(io.env, settings.dataDir);
  } catch (err) {
    io.stderr.write(`svc keys: ${(err as Error).message}\n`);
    return 1;
  }
  let res: Response;
  try {
    res = await fetch(`${base}${request.path}`, {
      method: request.method,
      headers: { authorization: `Bearer ${token}`, ...(request.body !== undefined ? { 'content-type': 'application/json' } : {}) },
      body: request.body === undefined ? undefined : JSON.stringify(request.body),
      signal: AbortSignal.timeout(30_000),
    });
  } catch (err) {
    const cause = (err as { cause?: { code?: string; message?: string } }).cause;
    io.stderr.write(`svc keys: cannot reach the gateway at ${base} (${cause?.code ?? cause?.message ?? (err as Error).message}); is \`svc serve\` running? (set SVC_URL to point elsewhere)\n`);
    return 1;
  }
  const text = await res.text();
  let body: any;
  try {
    body = JSON.parse(text);
  } catch {
    io.stderr.write(`svc keys: ${base} answered ${res.status} with something that is not JSON; is SVC_URL a gateway?\n`);
    return 1;
  }
  if (!res.ok) {
    if (parsed.json) io.stdout.write(`${JSON.stringify(body)}\n`);
    const message = body?.error?.message ?? text;
    const hint = res.status === 401 ? ` (the gateway at ${base} refused the admin token: check SVC_ADMIN_TOKEN or DATA_DIR)` : '';
    io.stderr.write(`svc keys: ${res.status} ${body?.error?.code ?? ''}: ${message}${hint}\n`);
    return 1;
  }
  if (parsed.json) {
    io.stdout.write(`${JSON.stringify(command === 'list' ? body.data : body, null, 2)}\n`);
    return 0;
  }
  if (command === 'list') io.stdout.write(body.data.length === 0 ? 'no keys\n' : keyTable(body.data));
  else if (command === 'create') io.stdout.write(`key (shown once, store it now): ${body.key}\n\n${details(body)}`);
  else io.stdout.write(details(body));
  return 0;
}
