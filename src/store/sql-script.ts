/**
 * Several parameterised statements as one script, for one round trip: each `$n` becomes its value as
 * a string literal (dollar-quoted, or escaped as E'...'), which PostgreSQL types exactly as it types a
 * parameter sent as text, by its cast or its context. Values are written as node-postgres writes parameters: null and
 * undefined as NULL, dates in ISO form, buffers as bytea hex, other objects as JSON.
 */
import type { BatchedStatement } from './types.ts';

export function sqlScript(statements: readonly BatchedStatement[]): string {
  return statements.map(({ sql, params = [] }) => `${inlineParams(sql, params)};`).join('\n');
}

function inlineParams(sql: string, params: readonly unknown[]): string {
  return sql.replace(/\$(\d+)/g, (_, n: string) => {
    const index = Number(n) - 1;
    if (index < 0 || index >= params.length) throw new RangeError(`statement refers to $${n} but has ${params.length} parameters: ${sql.slice(0, 80)}`);
    return literal(params[index]);
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
