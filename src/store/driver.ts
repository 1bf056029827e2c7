import type { Queryable } from './types.ts';

/** What the shared SQL event store needs from a database connection; one per adapter. */
export interface SqlDriver extends Queryable {
  readonly kind: 'postgres' | 'pglite';
  /** NOTIFY channel the append function signals on; null where every reader lives in this process. */
  readonly notifyChannel: string | null;
  /** Append batches in flight at once. */
  readonly maxInFlight: number;
  transaction<T>(fn: (tx: DriverTransaction) => Promise<T>): Promise<T>;
  /** Starts delivering other processes' commit hints; no-op where there are none. */
  listen(onHint: () => void): Promise<void>;
  close(): Promise<void>;
}

export interface DriverTransaction extends Queryable {
  /** Runs a script of several statements (migrations). */
  exec(sql: string): Promise<void>;
}
