/**
 * Several parameterised statements as one script, for one round trip: each `$n` becomes its value as
 * a string literal (dollar-quoted, or escaped as E'...'), which PostgreSQL types exactly as it types a
 * parameter sent as text, by its cast or its context. Values are written as node-postgres writes
 * parameters: null and undefined as NULL, dates in ISO form, buffers as bytea hex, other objects as JSON.
 *
 * A large text value that several statements cast (`$n::type`), such as the batch a projection's
 * statements all read, is written once: set first as a transaction-local setting, then read by each
 * statement as `current_setting(...)::type`, the same text under the same cast. The script stays one
 * copy of it, not one per statement, for the driver to encode and the server to read.
 */
import type { BatchedStatement } from './types.ts';

const placeholder = /\$(\d+)(::)?/g;
/** Below this a value is simply repeated. */
const sharedMinLength = 1024;

export function sqlScript(statements: readonly BatchedStatement[]): string {
  const shared = sharedValues(statements);
  const parts: string[] = [];
  for (const [value, name] of shared) parts.push(`SELECT set_config('${name}', ${literal(value)}, true);`);
  for (const { sql, params = [] } of statements) parts.push(`${inlineParams(sql, params, shared)};`);
  return parts.join('\n');
}

/** Large strings cast wherever they appear, appearing in more than one statement: value -> setting name. */
function sharedValues(statements: readonly BatchedStatement[]): Map<string, string> {
  const uses = new Map<string, { statements: number; castEverywhere: boolean }>();
  for (const { sql, params = [] } of statements) {
    const seen = new Set<string>();
    for (const [, n, cast] of sql.matchAll(placeholder)) {
      const value = params[Number(n) - 1];
      if (typeof value !== 'string' || value.length < sharedMinLength) continue;
      const use = uses.get(value) ?? { statements: 0, castEverywhere: true };
      if (!seen.has(value)) use.statements++;
      seen.add(value);
      use.castEverywhere &&= cast !== undefined;
      uses.set(value, use);
    }
  }
  const shared = new Map<string, string>();
  for (const [value, use] of uses) if (use.statements > 1 && use.castEverywhere) shared.set(value, `svc.batch_value_${shared.size + 1}`);
  return shared;
}

function inlineParams(sql: string, params: readonly unknown[], shared: ReadonlyMap<string, string>): string {
  return sql.replace(placeholder, (_, n: string, cast: string | undefined) => {
    const index = Number(n) - 1;
    if (index < 0 || index >= params.length) throw new RangeError(`statement refers to $${n} but has ${params.length} parameters: ${sql.slice(0, 80)}`);
    const value = params[index];
    const name = typeof value === 'string' ? shared.get(value) : undefined;
    return `${name ? `current_setting('${name}')` : literal(value)}${cast ?? ''}`;
  });
}

function literal(value: unknown): string {
  if (value === null || value === undefined) return 'NULL';
  let text: string;
  if (typeof value === 'string') text = value;
  else if (typeof value === 'number' || typeof value === 'bigint' || typeof value === 'boolean') text = String(value);
  else if (value instanceof Date) text = value.toISOString();
  else if (Buffer.isBuffer(value)) text = `\\x${value.toString('hex')}`;
  else text = JSON.stringify(value);
  if (text.includes('\0')) throw new RangeError('a text value cannot hold a NUL character');
  // Without a `$` in it, a value is taken verbatim between `$$` (nothing to escape, nothing copied): the
  // common case of the large ones, the projections' JSON batches. With one, it is escaped.
  if (!text.includes('$')) return `$$${text}$$`;
  return `E'${text.replaceAll('\\', '\\\\').replaceAll("'", "''")}'`;
}
