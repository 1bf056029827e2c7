/** The statements a test's stores send, counted on the drivers' own query calls (pg and PGlite), nothing changed in them. */
import pg from 'pg';
import { PGlite } from '@electric-sql/pglite';

/** Every statement text the drivers send, while `fn` runs. */
export async function countingQueries<T>(fn: (sent: string[]) => Promise<T>): Promise<T> {
  const sent: string[] = [];
  const textOf = (q: unknown) => (typeof q === 'string' ? q : ((q as { text?: string })?.text ?? ''));
  const pgQuery = pg.Client.prototype.query;
  const pgliteQuery = PGlite.prototype.query;
  pg.Client.prototype.query = function (this: pg.Client, ...args: unknown[]) {
    sent.push(textOf(args[0]));
    return (pgQuery as (...a: unknown[]) => unknown).apply(this, args);
  } as typeof pgQuery;
  PGlite.prototype.query = function (this: PGlite, ...args: unknown[]) {
    sent.push(textOf(args[0]));
    return (pgliteQuery as (...a: unknown[]) => unknown).apply(this, args);
  } as typeof pgliteQuery;
  try {
    return await fn(sent);
  } finally {
    pg.Client.prototype.query = pgQuery;
    PGlite.prototype.query = pgliteQuery;
  }
}
