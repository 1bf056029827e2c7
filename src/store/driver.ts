import type { Queryable } from './types.ts';

/** Runs a statement that the connection parses and plans once and keeps under `name`. */
export interface PreparedQueryable extends Queryable {
  queryPrepared<Row = Record<string, unknown>>(name: string, sql: string, params: unknown[]): Promise<{ rows: Row[] }>;
}

/** What the shared SQL event store needs from a database connection; one per adapter. */
export interface SqlDriver extends PreparedQueryable {
  readonly kind: 'postgres' | 'pglite';
  /** Tells other processes' readers that something committed (coalesced; no-op where every reader lives in this process). */
  hint(): void;
  /** Append batches in flight at once. */
  readonly maxInFlight: number;
  transaction<T>(fn: (tx: DriverTransaction) => Promise<T>): Promise<T>;
  /** Starts delivering other processes' commit hints; no-op where there are none. */
  listen(onHint: () => void): Promise<void>;
  close(): Promise<void>;
}

export interface DriverTransaction extends PreparedQueryable {
  /** Runs a script of several statements (migrations). */
  exec(sql: string): Promise<void>;
}
