/**
 * The store's two ports. `EventLog`: streams appended under an expected version, read one by one or
 * forward in one global order from an opaque position, and followed live. `SqlDatabase`: where
 * projections, checkpoints and workflow processors keep their rows, in transactions. Processors read
 * the one and write the other, so a log that is not SQL (KurrentDB, a Kafka topic) can feed the same
 * projections and workflows. `EventStore` is both at once: the SQL adapters (PostgreSQL, PGlite) keep
 * the log in the same database, and their transactions can also append and read the log.
 */

/** `any`: no check; `no_stream`: the stream must be empty; `stream_exists`: it must not be; N: its version must be N. */
export type ExpectedVersion = 'any' | 'no_stream' | 'stream_exists' | number;

/** An event to append. The id makes a repeated append (a retry after a lost acknowledgement) idempotent. */
export interface NewEvent<Type extends string = string, Data = unknown> {
  id: string;
  type: Type;
  data: Data;
  metadata?: Record<string, unknown>;
}

/**
 * A place in the global log. Opaque outside the log that issued it: processors and the command
 * handler only hand it back to the log (`readAll`, `subscribe`, `countAfter`), order positions with
 * the log's `comparePositions`, start from its `start`, and keep it through a checkpoint store that
 * knows that log. This is the SQL adapters' representation: they order and checkpoint by
 * (transactionId, position), since an event's position alone is not monotonic in commit order and the
 * pair read under the snapshot rule is. Another log brings its own (KurrentDB's commit/prepare pair,
 * a Kafka offset) and a checkpoint store that stores it.
 */
export interface GlobalPosition {
  transactionId: number;
  position: number;
}

export const logStart: GlobalPosition = Object.freeze({ transactionId: 0, position: 0 });

export interface RecordedEvent<Type extends string = string, Data = unknown> {
  id: string;
  type: Type;
  data: Data;
  metadata: Record<string, unknown>;
  streamId: string;
  /** 1 for the first event of a stream. */
  streamVersion: number;
  globalPosition: GlobalPosition;
  recordedAt: Date;
}

export interface AppendResult {
  /** The stream's version after the append: pass it as the expected version of the next one. */
  nextExpectedVersion: number;
  /** Where the append's last event sits in the global log. */
  lastPosition: GlobalPosition;
  /** True when these event ids were already appended at this place: nothing new was written. */
  idempotent: boolean;
}

export interface StreamRead {
  /** The stream's current version: the number of events in it, 0 when it does not exist. */
  version: number;
  events: RecordedEvent[];
}

/** A parameterised statement runner: the store's own connection, or one transaction's. */
export interface Queryable {
  query<Row = Record<string, unknown>>(sql: string, params?: unknown[]): Promise<{ rows: Row[] }>;
}

/** A transaction on the SQL database: projections and processors write their rows and checkpoints through it. */
export interface SqlTransaction extends Queryable {
  /**
   * Runs statements in order in one round trip, their parameters sent inline as quoted literals (typed
   * as a parameter is: by its cast or its context); no rows come back. For many small writes, such as
   * a projection's batch. A `$` in a statement must be a parameter reference.
   */
  queryBatch(statements: readonly BatchedStatement[]): Promise<void>;
}

/** A transaction of an `EventStore`: the log lives in the same database, so it can append and read it too. */
export interface StoreTransaction extends SqlTransaction {
  /**
   * Appends inside this transaction. It must be the transaction's first write, or follow only this
   * transaction's other appends (see DESIGN.md): otherwise `AppendNotFirstWrite`.
   */
  append(streamId: string, events: readonly NewEvent[], expected: ExpectedVersion): Promise<AppendResult>;
  /** `store.readAll` on this transaction's connection (the store's own methods refuse inside a transaction). */
  readAll(after: GlobalPosition, limit: number): Promise<RecordedEvent[]>;
}

export interface BatchedStatement {
  sql: string;
  params?: readonly unknown[];
}

export interface Subscription {
  /** Where the subscriber has got to: the last event it has handled. */
  readonly position: GlobalPosition;
  /** Resolves once the subscriber has handled every event committed before the call. */
  caughtUp(): Promise<void>;
  stop(): Promise<void>;
}

export interface SubscribeOptions {
  after?: GlobalPosition;
  batchSize?: number;
  /** Polling fallback when no wake-up hint arrives (ms). */
  pollIntervalMs?: number;
  /**
   * After a batch that caught up with the log, wait this long before reading again (default 0), so
   * that under steady writes each read takes what committed meanwhile instead of one commit at a time.
   * The first event after a quiet spell is still read at once.
   */
  gatherMs?: number;
  /**
   * Events whose metadata holds this value under this key are passed over: not handed to `handle`, and
   * their data and metadata not even read (the position still moves past them). A process following
   * other processes' writes skips its own this way, which under load is nearly all of them. A commit of
   * this process whose events are all passed over (here or by `eventTypes`) does not wake the
   * subscription: it reads them with the next one that does, another process's hint, or its poll.
   */
  skipMetadata?: { key: string; value: string };
  /**
   * Only events of these types are handed to `handle`; the others are passed over like skipped ones
   * (the position still moves past them, their data unread). For a processor that reacts to a few rare
   * types among the log's many.
   */
  eventTypes?: readonly string[];
  /** Called with each batch in global order (none when every event of it was skipped); the position advances once it resolves. */
  handle(events: RecordedEvent[]): Promise<void>;
  /** Called when `handle` or a read fails; the subscription retries the same batch after a pause. */
  onError?(error: unknown): void;
}

export interface PingResult {
  ok: boolean;
  latencyMs: number;
  error?: string;
}

/** The event log port: streams and one global order over them. */
export interface EventLog {
  /** The position before the log's first event: read from here to read everything. */
  readonly start: GlobalPosition;
  /** The log's order of positions: negative when `a` comes before `b`, 0 when they are the same place. */
  comparePositions(a: GlobalPosition, b: GlobalPosition): number;
  append(streamId: string, events: readonly NewEvent[], expected: ExpectedVersion): Promise<AppendResult>;
  /**
   * Sends the appends made so far now, where the log gathers them until the end of the turn (group
   * commit): for a caller whose appends of this turn are all made. Optional; without it, nothing changes.
   */
  sendAppendsNow?(): void;
  readStream(streamId: string, options?: { fromVersion?: number; limit?: number }): Promise<StreamRead>;
  /** Each stream's current version (0: no events), read in one snapshot: which of many streams exist, in one round trip. */
  streamVersions(streamIds: readonly string[]): Promise<Map<string, number>>;
  /** Events after `after` in global order, at most `limit`, never one whose transaction may still be overtaken. */
  readAll(after: GlobalPosition, limit: number): Promise<RecordedEvent[]>;
  /** The position of the last event a reader of the global log can see now (logStart when empty). */
  head(): Promise<GlobalPosition>;
  /**
   * Resolves once every event committed before the call can be read from the global log. A commit
   * becomes readable when every transaction older than it has ended, anywhere on the server.
   */
  readable(): Promise<void>;
  /** Count of readable events after a position (projection lag). */
  countAfter(after: GlobalPosition): Promise<number>;
  /** Catch-up then live: reads from `after`, hands batches over, then waits for commits. */
  subscribe(options: SubscribeOptions): Subscription;
  /** Registers a wake-up listener called after commits (this process's at once, others' through NOTIFY). */
  onCommit(listener: () => void): () => void;
  close(): Promise<void>;
}

/** The SQL database port: where projections, checkpoints and processors keep their rows. */
export interface SqlDatabase {
  /** Runs `fn` in one READ COMMITTED transaction. */
  transaction<T>(fn: (tx: SqlTransaction) => Promise<T>): Promise<T>;
  query<Row = Record<string, unknown>>(sql: string, params?: unknown[]): Promise<{ rows: Row[] }>;
  /** A cheap round trip to the database, bounded by a timeout (for /health). */
  ping(timeoutMs?: number): Promise<PingResult>;
  /**
   * The schema of the store's own tables (checkpoints, migrations) and the projections' helper tables,
   * `<schema>_internal`, out of the analysts' schema; SQL names them qualified (`internalTable`).
   */
  readonly internalSchema: string;
}

/** The log and the SQL database in one: the SQL adapters, whose transactions also append and read the log. */
export interface EventStore extends EventLog, SqlDatabase {
  readonly adapter: 'postgres' | 'pglite';
  /**
   * Runs `fn` in one READ COMMITTED transaction. Inside `fn`, use `tx`: the store's own methods refuse
   * with `StoreCallInsideTransaction` (on PGlite they would wait for the transaction forever).
   */
  transaction<T>(fn: (tx: StoreTransaction) => Promise<T>): Promise<T>;
}
