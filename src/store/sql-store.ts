/**
 * The event store over SQL, shared by the PostgreSQL and PGlite adapters: one schema
 * (infra/migrations), one append function, one reading rule for the global log. Appends are in
 * sql-append.ts, the reads' SQL in sql-read.ts, a subscription's loop in sql-subscription.ts.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { StoreCallInsideTransaction, StoreClosed } from './errors.ts';
import { encodeEvents } from './event-encoding.ts';
import type { PreparedQueryable, SqlDriver } from './driver.ts';
import { GroupCommitter } from './group-commit.ts';
import { comparePositions } from './position.ts';
import { runBatch, validateAppend } from './sql-append.ts';
import { eventColumns, pageStatement, pendingRecheckMs, readAllSql, toEvent, visible, type EventRow } from './sql-read.ts';
import { sqlSubscription } from './sql-subscription.ts';
import {
  logStart,
  type AppendResult,
  type EventStore,
  type GlobalPosition,
  type NewEvent,
  type PingResult,
  type RecordedEvent,
  type StoreTransaction,
  type StreamRead,
  type SubscribeOptions,
  type Subscription,
} from './types.ts';
import { WakeHub } from './wake.ts';
import { migrate } from './migrations.ts';
import { sqlScript } from './sql-script.ts';

export interface SqlStoreOptions {
  /** Largest batch a group commit sends (events). */
  maxBatchEvents?: number;
  /** Polling fallback for live subscriptions (ms). */
  pollIntervalMs?: number;
  /** Send cross-process wake-up hints after commits (default true; false only to measure what they cost). */
  notifyOtherProcesses?: boolean;
  /** At most one cross-process hint per this many ms (default 10; see OpenEventStoreOptions). */
  hintIntervalMs?: number;
  /** Told when a whole append batch fails (a broken connection, a deadlock): for logs and tests. */
  onBatchError?: (error: unknown) => void;
  /** Refuse the store's own calls inside a `transaction` callback (default true; see OpenEventStoreOptions). */
  nestedCallCheck?: boolean;
  /** Told how long each group commit's batch took to store (ms), failed ones included (for /metrics). */
  onAppend?: (ms: number) => void;
  /** Extra work at close (the data-directory lock, say). */
  onClose?: () => Promise<void> | void;
}

export async function openSqlEventStore(driver: SqlDriver, options: SqlStoreOptions = {}): Promise<EventStore> {
  const { internalSchema } = await migrate(driver);
  const hub = new WakeHub();
  /** Told of every commit: with its events when this process made it, with null for another process's hint. */
  const commitListeners = new Set<(events: readonly (readonly NewEvent[])[] | null) => void>();
  /** Set while one of this store's `transaction` callbacks runs: its other calls refuse inside it (null: not tracked). */
  const insideTransaction = options.nestedCallCheck === false ? null : new AsyncLocalStorage<boolean>();
  await driver.listen(() => {
    hub.notify();
    for (const listener of commitListeners) listener(null);
  });
  const pollIntervalMs = options.pollIntervalMs ?? 1000;
  const subscriptions = new Set<{ stop(): Promise<void> }>();
  let closed = false;

  // Other processes hear of this one's commits at most once per interval, after the commits that
  // call for it: a hint is a NOTIFY, a transaction of its own that wakes every listening process (this
  // one's too), and one per commit ran beside the next request's append (BENCHMARKS.md, gateway).
  // Readers poll besides, so a hint is never needed for correctness.
  const hintIntervalMs = options.hintIntervalMs ?? 10;
  let hintTimer: NodeJS.Timeout | null = null;
  let lastHintAt = -Infinity;
  const sendHint = () => {
    hintTimer = null;
    lastHintAt = performance.now();
    if (!closed) driver.hint();
  };
  const committed = (events: readonly (readonly NewEvent[])[]) => {
    hub.notify();
    for (const listener of commitListeners) listener(events);
    if (options.notifyOtherProcesses === false || hintTimer) return;
    hintTimer = setTimeout(sendHint, Math.max(0, lastHintAt + hintIntervalMs - performance.now()));
  };

  const committer = new GroupCommitter({
    maxInFlight: driver.maxInFlight,
    maxBatchEvents: options.maxBatchEvents ?? 1000,
    async execute(batch) {
      const started = options.onAppend ? performance.now() : 0;
      // PGlite plans every statement again (no prepared statements): there the INSERT's planning costs
      // more than the function it saves, whose plans plpgsql keeps (0.88-1.25 ms against 0.56-0.61).
      const outcomes = await runBatch(driver, batch, driver.kind === 'postgres').finally(() => options.onAppend?.(performance.now() - started));
      const stored = batch.filter((_, i) => { const o = outcomes[i]; return 'ok' in o && !o.ok.idempotent; }).map((append) => append.events);
      if (stored.length > 0) committed(stored);
      return outcomes;
    },
    onBatchError: options.onBatchError,
  });

  /** Open, and not called from inside a `store.transaction` callback (same refusal on both adapters). */
  const ensureOpen = (method?: string) => {
    if (closed) throw new StoreClosed();
    if (method && insideTransaction?.getStore()) throw new StoreCallInsideTransaction(method);
  };

  async function readAllOn(db: PreparedQueryable, after: GlobalPosition, limit: number): Promise<RecordedEvent[]> {
    const { rows } = await db.queryPrepared<EventRow>('svc_read_all', readAllSql, [String(after.transactionId), after.position, limit]);
    return rows.map(toEvent);
  }

  async function readAll(after: GlobalPosition, limit: number): Promise<RecordedEvent[]> {
    ensureOpen('readAll');
    return readAllOn(driver, after, limit);
  }

  /**
   * The next `limit` events for a subscriber that passes some over (`skip`, `types`): only the events it
   * is handed come back, and the page's last event, passed over or not (without data and metadata when
   * passed over), so that its position moves past the page. `scanned` is how many events the page held.
   * A follower of other processes' writes passes over nearly every event, and a workflow nearly every
   * one too: one row per passed event cost its reader 5-7 µs of CPU (BENCHMARKS.md, gateway).
   */
  async function readPage(after: GlobalPosition, limit: number, skip: { key: string; value: string } | null, types: readonly string[] | null): Promise<{ events: RecordedEvent[]; scanned: number }> {
    ensureOpen('readAll');
    const params: unknown[] = [String(after.transactionId), after.position, limit];
    if (types) params.push(types);
    if (skip) params.push(skip.key, skip.value);
    const page = pageStatement(skip !== null, types !== null);
    const { rows } = await driver.queryPrepared<EventRow & { scanned: string | number }>(page.name, page.sql, params);
    return { events: rows.map(toEvent), scanned: rows.length === 0 ? 0 : Number(rows[0].scanned) };
  }

  async function head(): Promise<GlobalPosition> {
    ensureOpen('head');
    const { rows } = await driver.query<{ tx: string; global_position: string | number }>(
      `SELECT transaction_id::text AS tx, global_position FROM events WHERE ${visible}
       ORDER BY transaction_id DESC, global_position DESC LIMIT 1`,
    );
    return rows.length === 0 ? logStart : { transactionId: Number(rows[0].tx), position: Number(rows[0].global_position) };
  }

  /**
   * The last event committed as far as this snapshot knows, visible to log readers or not yet (an
   * older transaction anywhere on the server still runs). "Caught up" means having read up to here.
   */
  async function lastCommitted(): Promise<GlobalPosition> {
    ensureOpen('lastCommitted');
    const { rows } = await driver.query<{ tx: string; global_position: string | number }>(
      `SELECT transaction_id::text AS tx, global_position FROM events
       ORDER BY transaction_id DESC, global_position DESC LIMIT 1`,
    );
    return rows.length === 0 ? logStart : { transactionId: Number(rows[0].tx), position: Number(rows[0].global_position) };
  }

  const source = {
    readAll,
    readPage,
    lastCommitted,
    commitListeners,
    subscriptions,
    insideTransaction,
    pollIntervalMs,
    get closed() {
      return closed;
    },
  };
  function subscribe(opts: SubscribeOptions): Subscription {
    ensureOpen();
    return sqlSubscription(source, opts);
  }

  const store: EventStore = {
    adapter: driver.kind,
    internalSchema,
    start: logStart,
    comparePositions,

    async append(streamId, events, expected) {
      ensureOpen('append');
      validateAppend(streamId, events, expected);
      return committer.append({ streamId, events, expected, encoded: encodeEvents(events) });
    },

    sendAppendsNow() {
      committer.sendNow();
    },

    async readStream(streamId, { fromVersion = 1, limit } = {}) {
      ensureOpen('readStream');
      // One statement, so the version and the events come from one snapshot.
      const { rows } = await driver.query<EventRow & { current_version: string | number }>(
        `SELECT s.current_version, e.* FROM
           (SELECT coalesce(max(stream_version), 0) AS current_version FROM events WHERE stream_id = $1) s
         LEFT JOIN LATERAL (
           SELECT ${eventColumns} FROM events
           WHERE events.stream_id = $1 AND events.stream_version >= $2
           ORDER BY events.stream_version LIMIT $3
         ) e ON true`,
        [streamId, fromVersion, limit ?? null],
      );
      return {
        version: Number(rows[0].current_version),
        events: rows[0].event_id === null ? [] : rows.map(toEvent),
      } satisfies StreamRead;
    },

    async streamVersions(streamIds) {
      ensureOpen('streamVersions');
      const { rows } = await driver.query<{ stream_id: string; version: string | number }>(
        `SELECT s.id AS stream_id, coalesce((SELECT max(stream_version) FROM events WHERE stream_id = s.id), 0) AS version
         FROM unnest($1::text[]) AS s(id)`,
        [[...streamIds]],
      );
      return new Map(rows.map((r) => [r.stream_id, Number(r.version)]));
    },

    readAll,
    head,

    async readable() {
      const target = await lastCommitted();
      for (let delay = 2; ; delay = Math.min(delay * 2, pendingRecheckMs)) {
        const generation = hub.generation;
        if (comparePositions(await head(), target) >= 0) return;
        await hub.wait(generation, delay);
      }
    },

    async countAfter(after) {
      ensureOpen('countAfter');
      const { rows } = await driver.query<{ n: string | number }>(
        `SELECT count(*) AS n FROM events WHERE (transaction_id, global_position) > ($1::text::xid8, $2::bigint) AND ${visible}`,
        [String(after.transactionId), after.position],
      );
      return Number(rows[0].n);
    },

    subscribe,

    onCommit(listener) {
      return hub.on(listener);
    },

    async transaction<T>(fn: (tx: StoreTransaction) => Promise<T>): Promise<T> {
      ensureOpen('transaction');
      const appended: (readonly NewEvent[])[] = [];
      const result = await driver.transaction((tx) => {
        const inside = () => fn({
          query: (sql, params) => tx.query(sql, params),
          queryBatch: (statements) => (statements.length === 0 ? Promise.resolve() : tx.exec(sqlScript(statements))),
          readAll: (after, limit) => readAllOn(tx, after, limit),
          async append(streamId, events, expected): Promise<AppendResult> {
            validateAppend(streamId, events, expected);
            const encoded = encodeEvents(events);
            for (;;) {
              const [outcome] = await runBatch(tx, [{ streamId, events, expected, encoded }], false);
              if ('retry' in outcome) continue; // another process's append to this stream went first; `any` goes on top
              if ('error' in outcome) throw outcome.error;
              if (!outcome.ok.idempotent) appended.push(events);
              return outcome.ok;
            }
          },
        });
        return insideTransaction ? insideTransaction.run(true, inside) : inside();
      });
      if (appended.length > 0) committed(appended);
      return result;
    },

    async query(sql, params) {
      ensureOpen('query');
      return driver.query(sql, params);
    },

    async ping(timeoutMs = 1000): Promise<PingResult> {
      const started = performance.now();
      let timer: NodeJS.Timeout | undefined;
      try {
        if (closed) throw new StoreClosed();
        await Promise.race([
          driver.query('SELECT 1'),
          new Promise((_, reject) => {
            timer = setTimeout(() => reject(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
          }),
        ]);
        return { ok: true, latencyMs: Math.round((performance.now() - started) * 100) / 100 };
      } catch (error) {
        return { ok: false, latencyMs: Math.round((performance.now() - started) * 100) / 100, error: (error as Error).message };
      } finally {
        clearTimeout(timer);
      }
    },

    async close() {
      if (closed) return;
      for (const s of [...subscriptions]) await s.stop();
      await committer.drained();
      if (hintTimer) {
        clearTimeout(hintTimer);
        sendHint(); // the last commits' hint, before the connections close
      }
      closed = true;
      try {
        await driver.close();
      } finally {
        await options.onClose?.();
      }
    },
  };
  return store;
}
