/**
 * The projection runner: each projection reads the global log from its checkpoint and applies
 * batches, writing its rows and its checkpoint in one transaction; catch-up first, then live.
 */
import {
  comparePositions,
  logStart,
  type EventStore,
  type GlobalPosition,
  type Queryable,
  type RecordedEvent,
  type Subscription,
} from '../store/index.ts';
import type { Projection } from './projection.ts';

export interface ProjectionRunnerOptions {
  store: EventStore;
  projections: readonly Projection[];
  /** Events per transaction while live (default 500). */
  batchSize?: number;
  /** Events per transaction during a rebuild (default 5,000). */
  rebuildBatchSize?: number;
  /** Polling fallback when no commit hint arrives (ms). */
  pollIntervalMs?: number;
  /**
   * While live, a projection that caught up waits this long before reading again (default 50 ms): under
   * steady load each transaction then applies what 50 ms brought instead of one commit's events, and
   * the per-batch cost (a read, a transaction, the checkpoint) is paid once, not once per commit.
   */
  gatherMs?: number;
  /** Told about failed batches; the runner retries them. */
  onError?(projection: string, error: unknown): void;
}

export interface ProjectionStatus {
  name: string;
  position: GlobalPosition;
  /** Readable events after the checkpoint. */
  lag: number;
  updatedAt: Date | null;
  /** Whether this runner is applying it live. */
  live: boolean;
}

export interface RebuildProgress {
  name: string;
  done: number;
  total: number;
  elapsedMs: number;
}

export interface RebuildReport {
  name: string;
  events: number;
  seconds: number;
  eventsPerSecond: number;
}

/** Another runner (another process, a rebuild) moved the checkpoint: reload it and go on from there. */
export class CheckpointMoved extends Error {
  override name = 'CheckpointMoved';
}

async function readCheckpoint(db: Queryable, name: string, lock = false): Promise<{ position: GlobalPosition; updatedAt: Date } | null> {
  const { rows } = await db.query<{ transaction_id: string; global_position: string | number; updated_at: Date | string }>(
    `SELECT transaction_id::text AS transaction_id, global_position, updated_at FROM projection_checkpoints WHERE name = $1${lock ? ' FOR UPDATE' : ''}`,
    [name],
  );
  if (rows.length === 0) return null;
  return {
    position: { transactionId: Number(rows[0].transaction_id), position: Number(rows[0].global_position) },
    updatedAt: new Date(rows[0].updated_at),
  };
}

function quoteIdent(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

/** Puts the scratch schema first on this transaction's search_path: unqualified table names resolve there. */
async function useScratch(tx: Queryable, scratch: { schema: string; searchPath: string }): Promise<void> {
  await tx.query(`SELECT set_config('search_path', $1, true)`, [`${quoteIdent(scratch.schema)}, ${scratch.searchPath}`]);
}

/**
 * Replaces the rows of the live `table` by those of its rebuilt copy. Same columns: the rows are
 * replaced in place (the table keeps its identity, so views, grants and indexes over it survive, and
 * MVCC readers see old or new rows, whole). Columns changed (the projection's definition did): the copy
 * replaces the table, which fails, rolling the swap back, if views still depend on the old one.
 */
async function swapTable(tx: Queryable, scratchSchema: string, table: string): Promise<void> {
  const columns = (relation: string) =>
    tx.query<{ c: string | null }>(
      `SELECT string_agg(quote_ident(attname) || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum) AS c
       FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped`,
      [relation],
    );
  // `table` as the projection writes it in its SQL (an unqualified name)
  const copy = `${quoteIdent(scratchSchema)}.${table}`;
  const [live, rebuilt] = [(await columns(table)).rows[0].c, (await columns(copy)).rows[0].c];
  if (live === rebuilt) {
    await tx.query(`DELETE FROM ${table}`);
    await tx.query(`INSERT INTO ${table} SELECT * FROM ${copy}`);
    return;
  }
  const { rows } = await tx.query<{ schema: string }>(`SELECT relnamespace::regnamespace::text AS schema FROM pg_class WHERE oid = $1::regclass`, [table]);
  await tx.query(`DROP TABLE ${table}`);
  await tx.query(`ALTER TABLE ${copy} SET SCHEMA ${rows[0].schema}`);
}

export class ProjectionRunner {
  readonly #store: EventStore;
  readonly #projections: Map<string, Projection>;
  readonly #options: ProjectionRunnerOptions;
  readonly #live = new Map<string, Subscription>();
  readonly #restarting = new Map<string, Promise<void>>();
  #started = false;

  constructor(options: ProjectionRunnerOptions) {
    this.#store = options.store;
    this.#options = options;
    this.#projections = new Map(options.projections.map((p) => [p.name, p]));
    if (this.#projections.size !== options.projections.length) throw new Error('projection names must be unique');
  }

  get names(): string[] {
    return [...this.#projections.keys()];
  }

  /** Creates missing tables and checkpoints, then applies every projection live (catch-up first). */
  async start(): Promise<void> {
    if (this.#started) return;
    this.#started = true;
    for (const projection of this.#projections.values()) {
      await this.#init(projection);
      await this.#startLive(projection);
    }
  }

  /** Resolves once every live projection has applied every event committed before the call. */
  async caughtUp(): Promise<void> {
    for (;;) {
      await Promise.all([...this.#restarting.values()]);
      try {
        await Promise.all([...this.#live.values()].map((s) => s.caughtUp()));
        return;
      } catch (error) {
        // a subscription restarted (its checkpoint moved) while we waited: wait on its successor
        if (!this.#started) throw error;
      }
    }
  }

  async status(): Promise<ProjectionStatus[]> {
    const result: ProjectionStatus[] = [];
    for (const name of this.#projections.keys()) {
      const checkpoint = await readCheckpoint(this.#store, name).catch(() => null);
      const position = checkpoint?.position ?? logStart;
      result.push({ name, position, lag: await this.#store.countAfter(position), updatedAt: checkpoint?.updatedAt ?? null, live: this.#live.has(name) });
    }
    return result;
  }

  /**
   * Replays the whole log into fresh copies of the projection's tables, then swaps them in, in one
   * transaction: readers see the old rows until the swap commits and the new ones after it, never a
   * part-built table, and views over the tables survive. Live application resumes after.
   *
   * The copies are built in a scratch schema (`<schema>_rebuild_<name>`): `init` and `apply` run with
   * that schema first on the search_path, so a projection's unqualified table names land there.
   */
  async rebuild(name: string, onProgress?: (progress: RebuildProgress) => void): Promise<RebuildReport> {
    const projection = this.#projections.get(name);
    if (!projection) throw new Error(`unknown projection "${name}" (known: ${this.names.join(', ') || 'none'})`);
    const wasLive = this.#live.has(name);
    await this.#stopLive(name);
    const started = performance.now();
    const store = this.#store;
    let scratch: { schema: string; searchPath: string } | null = null;
    try {
      scratch = await store.transaction(async (tx) => {
        const { rows } = await tx.query<{ schema: string; search_path: string }>(
          `SELECT left(current_schema() || '_rebuild_' || $1::text, 63) AS schema, current_setting('search_path') AS search_path`,
          [name],
        );
        const found = { schema: rows[0].schema, searchPath: rows[0].search_path };
        await tx.query(`DROP SCHEMA IF EXISTS ${quoteIdent(found.schema)} CASCADE`); // an interrupted rebuild's
        await tx.query(`CREATE SCHEMA ${quoteIdent(found.schema)}`);
        await useScratch(tx, found);
        await projection.init(tx);
        return found;
      });
      const inScratch = scratch;
      const wanted = projection.eventTypes ? new Set(projection.eventTypes) : null;
      const applyInScratch = async (tx: Queryable, batch: readonly RecordedEvent[]) => {
        const relevant = wanted ? batch.filter((e) => wanted.has(e.type)) : batch;
        if (relevant.length > 0) await projection.apply(relevant, tx);
      };
      const total = await store.countAfter(logStart);
      const batchSize = this.#options.rebuildBatchSize ?? 5000;
      let position = logStart;
      let done = 0;
      // Batch by batch, each in its own transaction (one long transaction would hold back every reader
      // of the global log); the next batch is read while the current one is applied.
      let next = store.readAll(position, batchSize);
      for (;;) {
        const batch = await next;
        if (batch.length === 0) break;
        next = store.readAll(batch[batch.length - 1].globalPosition, batchSize);
        next.catch(() => {}); // awaited on the next turn; a failure there is reported then
        await store.transaction(async (tx) => {
          await useScratch(tx, inScratch);
          await applyInScratch(tx, batch);
        });
        position = batch[batch.length - 1].globalPosition;
        done += batch.length;
        onProgress?.({ name, done, total: Math.max(total, done), elapsedMs: performance.now() - started });
      }
      // The swap: with the checkpoint row locked (live runners of this projection wait), apply what
      // was committed since the last batch, copy the new rows over the live ones, move the checkpoint.
      await store.transaction(async (tx) => {
        await readCheckpoint(tx, name, true);
        await useScratch(tx, inScratch);
        for (;;) {
          const batch = await tx.readAll(position, batchSize);
          if (batch.length === 0) break;
          await applyInScratch(tx, batch);
          position = batch[batch.length - 1].globalPosition;
          done += batch.length;
        }
        await tx.query(`SELECT set_config('search_path', $1, true)`, [inScratch.searchPath]);
        await projection.init(tx); // live tables that do not exist yet
        for (const table of projection.tables) await swapTable(tx, inScratch.schema, table);
        await tx.query(
          `INSERT INTO projection_checkpoints (name, transaction_id, global_position, updated_at) VALUES ($1, $2::text::xid8, $3, now())
           ON CONFLICT (name) DO UPDATE SET transaction_id = excluded.transaction_id, global_position = excluded.global_position, updated_at = now()`,
          [name, String(position.transactionId), position.position],
        );
        await tx.query(`DROP SCHEMA ${quoteIdent(inScratch.schema)} CASCADE`);
      });
      scratch = null;
      onProgress?.({ name, done, total: Math.max(total, done), elapsedMs: performance.now() - started });
      const seconds = (performance.now() - started) / 1000;
      return { name, events: done, seconds, eventsPerSecond: seconds > 0 ? done / seconds : 0 };
    } finally {
      // a failed rebuild leaves the live tables as they were; its scratch copies go
      if (scratch) await store.query(`DROP SCHEMA IF EXISTS ${quoteIdent(scratch.schema)} CASCADE`).catch(() => {});
      if (wasLive) await this.#startLive(projection);
    }
  }

  async stop(): Promise<void> {
    this.#started = false;
    await Promise.all([...this.#restarting.values()]);
    for (const name of [...this.#live.keys()]) await this.#stopLive(name);
  }

  async #init(projection: Projection): Promise<void> {
    await this.#store.transaction(async (tx) => {
      await projection.init(tx);
      await tx.query(`INSERT INTO projection_checkpoints (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, [projection.name]);
    });
  }

  /** Applies one batch and moves the checkpoint from `from` to the batch's end, atomically. */
  async #applyBatch(projection: Projection, from: GlobalPosition, batch: readonly RecordedEvent[]): Promise<void> {
    const last = batch[batch.length - 1].globalPosition;
    const wanted = projection.eventTypes ? new Set(projection.eventTypes) : null;
    const relevant = wanted ? batch.filter((e) => wanted.has(e.type)) : batch;
    await this.#store.transaction(async (tx) => {
      // Locking the checkpoint row serializes runners of one projection across processes.
      const checkpoint = await readCheckpoint(tx, projection.name, true);
      if (!checkpoint || comparePositions(checkpoint.position, from) !== 0) throw new CheckpointMoved(`checkpoint of ${projection.name} moved`);
      if (relevant.length > 0) await projection.apply(relevant, tx);
      await tx.query(
        `UPDATE projection_checkpoints SET transaction_id = $2::text::xid8, global_position = $3, updated_at = now() WHERE name = $1`,
        [projection.name, String(last.transactionId), last.position],
      );
    });
  }

  async #startLive(projection: Projection): Promise<void> {
    const checkpoint = await readCheckpoint(this.#store, projection.name);
    let position = checkpoint?.position ?? logStart;
    const subscription = this.#store.subscribe({
      after: position,
      batchSize: this.#options.batchSize ?? 500,
      pollIntervalMs: this.#options.pollIntervalMs,
      gatherMs: this.#options.gatherMs ?? 50,
      handle: async (events) => {
        await this.#applyBatch(projection, position, events);
        position = events[events.length - 1].globalPosition;
      },
      onError: (error) => {
        if (error instanceof CheckpointMoved) {
          this.#restart(projection);
          return;
        }
        this.#options.onError?.(projection.name, error);
      },
    });
    this.#live.set(projection.name, subscription);
  }

  #restart(projection: Projection): void {
    if (this.#restarting.has(projection.name)) return;
    const restart = (async () => {
      await this.#stopLive(projection.name);
      if (this.#started) await this.#startLive(projection);
    })()
      .catch((error) => this.#options.onError?.(projection.name, error))
      .finally(() => this.#restarting.delete(projection.name));
    this.#restarting.set(projection.name, restart);
  }

  async #stopLive(name: string): Promise<void> {
    const subscription = this.#live.get(name);
    if (!subscription) return;
    this.#live.delete(name);
    await subscription.stop();
  }
}
