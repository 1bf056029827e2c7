/**
 * `COMMENT ON` for the analysts' tables, so `\dt+` and `\d+` in psql explain every table and column
 * (the README says the same at more length). Run by each projection's `init`: one statement, and
 * idempotent (a comment is replaced, never added twice).
 */
import type { Queryable } from '../src/event-sourcing/index.ts';

const literal = (text: string) => `'${text.replaceAll("'", "''")}'`;

export function describeTable(db: Queryable, table: string, comment: string, columns: Readonly<Record<string, string>>): Promise<unknown> {
  const statements = [
    `COMMENT ON TABLE ${table} IS ${literal(comment)};`,
    ...Object.entries(columns).map(([column, text]) => `COMMENT ON COLUMN ${table}.${column} IS ${literal(text)};`),
  ];
  return db.query(`DO $comments$ BEGIN\n${statements.join('\n')}\nEND $comments$`);
}
