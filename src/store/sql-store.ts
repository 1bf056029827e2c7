/**
 * The event store over SQL, shared by the PostgreSQL and PGlite adapters: one schema
 * (infra/migrations), one append function, one reading rule for the global log.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { AppendNotFirstWrite, DuplicateEventId, EventNotStorable, InvalidEvent, StoreCallInsideTransaction, StoreClosed, WrongExpectedVersion } from './errors.ts';
import { decodeEscaped, encodeEvents, isEscaped, storableText } from './event-encoding.ts';
import type { PreparedQueryable, SqlDriver } from './driver.ts';
import { GroupCommitter, type BatchOutcome, type PendingAppend } from './group-commit.ts';
import { comparePositions } from './position.ts';
import {
  logStart,
  type AppendResult,
  type EventStore,
  type ExpectedVersion,
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

const uuidPattern = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * When an event was stored, as epoch milliseconds: a number the driver hands over as is, where a
 * timestamptz column is parsed by the driver's date parser into a Date (a regular expression per event,
 * about 14 µs of a metered request's CPU in the projections' reads; BENCHMARKS.md, gateway).
 */
const recordedMs = `(extract(epoch FROM recorded_at) * 1000)::float8 AS recorded_ms`;

// `tx`, not `transaction_id`: an output column named like the input one would make ORDER BY sort the text.
const columnsOf = (data: string, metadata: string) => `global_position, transaction_id::text AS tx, stream_id, stream_version,
  event_id::text AS event_id, event_type, ${data} AS data, ${metadata} AS metadata, ${recordedMs}`;
const eventColumns = columnsOf('data', 'metadata');
/** Whether a subscriber passes an event over: its metadata holds $5 under the key $4. */
const skipped = `metadata->>$4 = $5`;
/** Or it is of none of the types $4 (and, with $5 and $6, skipped as above). */
const otherType = `NOT (event_type = ANY($4::text[]))`;
const otherTypeOrSkipped = `${otherType} OR metadata->>$5 = $6`;

/** Only rows whose transaction is older than every running one: nothing can commit before them later. */
const visible = `transaction_id < pg_snapshot_xmin(pg_current_snapshot())`;

// Reads that subscriptions repeat many times a second go as prepared statements: parsed and planned
// once per connection, where each read cost PostgreSQL 0.29 ms of parsing and 0.28 of binding (a
// gateway's log, 976 reads in 20 s of sequential requests). Their plan is the same for any position.
const readAllSql = `SELECT ${eventColumns} FROM events
  WHERE (transaction_id, global_position) > ($1::text::xid8, $2::bigint) AND ${visible}
  ORDER BY transaction_id, global_position LIMIT $3`;

/** A page for `readPage`: the events a subscriber passes over (`passed`) dropped but the last. */
const pageSql = (passed: string) => `SELECT ${columnsOf('CASE WHEN passed THEN NULL ELSE data END', 'CASE WHEN passed THEN NULL ELSE metadata END')}, scanned FROM (
    SELECT page.*, count(*) OVER () AS scanned, row_number() OVER (ORDER BY transaction_id, global_position) AS nth FROM (
      SELECT *, coalesce(${passed}, false) AS passed FROM events
      WHERE (transaction_id, global_position) > ($1::text::xid8, $2::bigint) AND ${visible}
      ORDER BY transaction_id, global_position LIMIT $3) AS page) AS counted
  WHERE NOT passed OR nth = scanned
  ORDER BY transaction_id, global_position`;
const readPageSkipping = { name: 'svc_read_page_skipping', sql: pageSql(skipped) };
const readPageOfTypes = { name: 'svc_read_page_of_types', sql: pageSql(otherType) };
const readPageOfTypesSkipping = { name: 'svc_read_page_of_types_skipping', sql: pageSql(otherTypeOrSkipped) };

interface EventRow {
  global_position: string | number;
  tx: string;
  stream_id: string;
  stream_version: string | number;
  event_id: string;
  event_type: string;
  data: unknown;
  metadata: Record<string, unknown>;
  recorded_ms: number | string;
}

interface BatchRow {
  idx: number;
  outcome: 'ok' | 'idempotent' | 'conflict' | 'duplicate' | 'retry';
  version: string | number;
  last_position: string | number | null;
  last_tx: string | null;
}

function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener('abort', done, { once: true });
  });
}

function toEvent(row: EventRow): RecordedEvent {
  // An event stored escaped (a string jsonb refuses) is restored; the others are handed over as read.
  const { data, metadata } = isEscaped(row.metadata) ? decodeEscaped(row.data, row.metadata) : row;
  return {
    id: row.event_id,
    type: row.event_type,
    data,
    metadata,
    streamId: row.stream_id,
    streamVersion: Number(row.stream_version),
    globalPosition: { transactionId: Number(row.tx), position: Number(row.global_position) },
    recordedAt: new Date(Math.floor(Number(row.recorded_ms))),
  };
}

/**
 * Refuses, before anything is queued, what would fail in the database: an append that reached a
 * group-commit batch and failed there would cost every other append of the batch a retry.
 */
function validateAppend(streamId: string, events: readonly NewEvent[], expected: ExpectedVersion): void {
  if (typeof streamId !== 'string' || streamId.length === 0) throw new TypeError('append: stream id must be a non-empty string');
  if (!storableText(streamId)) throw new InvalidEvent(streamId, 'stream_id');
  if (!Array.isArray(events) || events.length === 0) throw new TypeError(`append to ${streamId}: at least one event is needed`);
  if (typeof expected === 'number' ? !Number.isSafeInteger(expected) || expected < 0 : !['any', 'no_stream', 'stream_exists'].includes(expected)) {
    throw new TypeError(`append to ${streamId}: invalid expected version ${String(expected)}`);
  }
  const ids = events.length > 1 ? new Set<string>() : null;
  for (const event of events) {
    if (typeof event.id !== 'string' || !uuidPattern.test(event.id)) throw new TypeError(`append to ${streamId}: event id must be a UUID`);
    if (ids) {
      if (ids.has(event.id.toLowerCase())) throw new TypeError(`append to ${streamId}: event id ${event.id} appears twice`);
      ids.add(event.id.toLowerCase());
    }
    if (typeof event.type !== 'string' || event.type.length === 0) throw new TypeError(`append to ${streamId}: event type must be a non-empty string`);
    if (!storableText(event.type)) throw new InvalidEvent(streamId, 'event_type');
    const metadata: unknown = event.metadata;
    if (metadata != null && (typeof metadata !== 'object' || Array.isArray(metadata))) throw new TypeError(`append to ${streamId}: event metadata must be an object`);
  }
}

const expectedCode = { any: -1, no_stream: -2, stream_exists: -3 } as const;

/** The append function's parameters: one array per column, so the database parses each event once. */
function batchParams(batch: readonly PendingAppend[]): unknown[] {
  const streams: string[] = [];
  const expected: number[] = [];
  const counts: number[] = [];
  const evAppend: number[] = [];
  const evOrd: number[] = [];
  const ids: string[] = [];
  const types: string[] = [];
  const data: string[] = [];
  const meta: string[] = [];
  batch.forEach((append, i) => {
    streams.push(append.streamId);
    expected.push(typeof append.expected === 'number' ? append.expected : expectedCode[append.expected]);
    counts.push(append.events.length);
    append.events.forEach((event, j) => {
      evAppend.push(i + 1);
      evOrd.push(j + 1);
      ids.push(event.id);
      types.push(event.type);
    });
    // serialized (and escaped where needed) once, when the append was made
    data.push(append.encoded.data);
    meta.push(append.encoded.metadata);
  });
  return [streams, expected, counts, evAppend, evOrd, ids, types, `[${data.join(',')}]`, `[${meta.join(',')}]`];
}

/** The plain INSERT's: the function's, with the version each append follows for its expected one, and no counts. */
function explicitParams(batch: readonly PendingAppend[], follows: readonly number[]): unknown[] {
  const params = batchParams(batch);
  return [params[0], follows, ...params.slice(3)];
}

function toOutcome(append: PendingAppend, row: BatchRow): BatchOutcome {
  const version = Number(row.version);
  switch (row.outcome) {
    case 'ok':
    case 'idempotent':
      return {
        ok: {
          nextExpectedVersion: version,
          lastPosition: { transactionId: Number(row.last_tx), position: Number(row.last_position) },
          idempotent: row.outcome === 'idempotent',
        },
      };
    case 'conflict':
      return { error: new WrongExpectedVersion(append.streamId, append.expected, version) };
    case 'duplicate':
      return { error: new DuplicateEventId(append.streamId, version) };
    case 'retry':
      return { retry: true };
    default:
      return { error: new Error(`append to ${append.streamId}: unexpected outcome ${String(row.outcome)}`) };
  }
}

/** untranslatable_character (`\u0000` in jsonb), character_not_in_repertoire (NUL in text), invalid_text_representation. */
const refusedValueCodes = new Set(['22P05', '22021', '22P02']);

const appendBatchSql = `SELECT idx, outcome, version, last_position, last_tx
  FROM svc_append_batch($1::text[], $2::bigint[], $3::int[], $4::int[], $5::int[], $6::uuid[], $7::text[], $8::jsonb, $9::jsonb)`;

/**
 * The common case as one plain INSERT: every append of the batch names the version it follows, so no
 * stream's version is read first and no function runs (here 0.37 ms a commit at p50 against the
 * function's 0.44-0.50, interleaved on one connection; a bare one-row INSERT takes 0.32). It keeps the
 * function's rules: the same per-stream locks, taken first and in the same order (the WHERE's
 * subquery runs once, before the first row), so it and the function never wait on each other in a
 * cycle and a stream's later versions belong to later transactions. The primary key (stream, version)
 * and the event-id index refuse what the function would sort out (another writer got there first, a
 * resend of stored events), and a named version that is not stored gives its rows no version, which
 * the table refuses: the statement is then undone whole and the batch goes to the function.
 */
// The arrays are read through subqueries so that no plan knows their length: the generic plan then
// costs what a custom one does and is kept, instead of planning the statement again at every call.
const appendExplicitSql = `INSERT INTO events (stream_id, stream_version, event_id, event_type, data, metadata)
  SELECT s.stream_id,
    CASE WHEN (SELECT bool_and(c.expected = 0 OR EXISTS (SELECT 1 FROM events e WHERE e.stream_id = c.stream_id AND e.stream_version = c.expected))
               FROM unnest((SELECT $1::text[]), (SELECT $2::bigint[])) AS c(stream_id, expected))
      THEN s.expected + ev.ord END,
    ev.event_id, ev.event_type, ev.data, ev.metadata
  FROM ROWS FROM (unnest($3::int[]), unnest($4::int[]), unnest($5::uuid[]), unnest($6::text[]),
                  jsonb_array_elements($7::jsonb), jsonb_array_elements($8::jsonb))
         AS ev(append_idx, ord, event_id, event_type, data, metadata)
  JOIN unnest((SELECT $1::text[]), (SELECT $2::bigint[])) WITH ORDINALITY AS s(stream_id, expected, idx) ON s.idx = ev.append_idx
  WHERE (SELECT count(*) FROM (
    SELECT pg_advisory_xact_lock(1937138433, l.k) FROM (SELECT DISTINCT hashtext(x) AS k FROM unnest((SELECT $1::text[])) AS x ORDER BY 1) AS l) AS locked) > 0
  ORDER BY ev.append_idx, ev.ord
  RETURNING stream_id, global_position, transaction_id::text AS tx`;

/**
 * The same for the commonest batches on the latency path, a few appends of one event each (a
 * sequential request's reservation, alone or with the previous request's settlement): plain parameters,
 * six per append, instead of arrays unnested and a JSON array taken apart. The same rules in the same
 * order: the streams' locks in lock-key order (an init plan, taken before any row is made), then each
 * named version's check, rows in call order. For one append of one event: 0.67-0.70 ms a commit at p50
 * against the array statement's 0.75-0.77, interleaved on one connection (a bare one-row INSERT:
 * 0.54-0.58); through the store, one append at a time, 0.64 against 0.70 back to back and 1.26-1.31
 * against 1.43-1.45 after 2 ms idle. For two: 0.68 against 0.72. At the gateway, sequential metered
 * requests alternated with a build that had the one-append case only: p50 3.293 against 3.361 ms and
 * 3.540 against 3.568.
 */
const appendValuesMax = 4;
/** By count: `appendValuesSql[n - 1]` stores n appends of one event each. */
const appendValuesSql = Array.from({ length: appendValuesMax }, (_, i) => i + 1).map((count) => {
  const rows = Array.from({ length: count }, (_, i) => {
    const p = (n: number) => `$${i * 6 + n}`;
    return `(${p(1)}::text, ${p(2)}::bigint, ${p(3)}::uuid, ${p(4)}::text, ${p(5)}::jsonb, ${p(6)}::jsonb, ${i + 1})`;
  });
  const streams = Array.from({ length: count }, (_, i) => `($${i * 6 + 1}::text)`);
  return `INSERT INTO events (stream_id, stream_version, event_id, event_type, data, metadata)
  SELECT v.stream_id,
    CASE WHEN v.follows = 0 OR EXISTS (SELECT 1 FROM events e WHERE e.stream_id = v.stream_id AND e.stream_version = v.follows) THEN v.follows + 1 END,
    v.event_id, v.event_type, v.data, v.metadata
  FROM (VALUES ${rows.join(', ')}) AS v(stream_id, follows, event_id, event_type, data, metadata, ord)
  WHERE (SELECT count(*) FROM (
    SELECT pg_advisory_xact_lock(1937138433, l.k) FROM (SELECT DISTINCT hashtext(s.id) AS k FROM (VALUES ${streams.join(', ')}) AS s(id) ORDER BY 1) AS l) AS locked) > 0
  ORDER BY v.ord
  RETURNING stream_id, global_position, transaction_id::text AS tx`;
});

/** What the plain INSERTs return, one row per event. */
type AppendedRow = { stream_id: string; global_position: string | number; tx: string };

/** unique_violation (a version or an event id taken), not_null_violation (a named version not stored). */
const explicitFallbackCodes = new Set(['23505', '23502']);

/**
 * Stores a batch: with `plainInsert` (a batch of its own, outside a transaction, on a connection that
 * keeps prepared statements), a batch whose appends all name their version goes as one plain INSERT
 * (`appendExplicitSql`); anything else, or what that refuses, through the append function.
 */
async function runBatch(db: PreparedQueryable, batch: readonly PendingAppend[], plainInsert: boolean): Promise<BatchOutcome[]> {
  if (plainInsert && batch.every((append) => typeof append.expected === 'number' || append.expected === 'no_stream')) {
    try {
      const follows = batch.map((append) => (typeof append.expected === 'number' ? append.expected : 0));
      const plain = batch.length <= appendValuesMax && batch.every((append) => append.events.length === 1);
      const { rows } = plain
        ? await db.queryPrepared<AppendedRow>(
            `svc_append_values_${batch.length}`,
            appendValuesSql[batch.length - 1],
            batch.flatMap((append, i) => [append.streamId, follows[i], append.events[0].id, append.events[0].type, append.encoded.data, append.encoded.metadata]),
          )
        : await db.queryPrepared<AppendedRow>('svc_append_explicit', appendExplicitSql, explicitParams(batch, follows));
      const last = new Map<string, number>();
      for (const row of rows) last.set(row.stream_id, Math.max(last.get(row.stream_id) ?? 0, Number(row.global_position)));
      const transactionId = Number(rows[0].tx);
      return batch.map((append, i) => ({
        ok: {
          nextExpectedVersion: follows[i] + append.events.length,
          lastPosition: { transactionId, position: last.get(append.streamId)! },
          idempotent: false,
        },
      }));
    } catch (error) {
      if (!explicitFallbackCodes.has((error as { code?: string }).code ?? '')) throw storeError(error, batch);
    }
  }
  let rows: BatchRow[];
  try {
    // Prepared once per connection: the call is parsed and planned once, not per batch.
    ({ rows } = await db.queryPrepared<BatchRow>('svc_append_batch', appendBatchSql, batchParams(batch)));
  } catch (error) {
    throw storeError(error, batch);
  }
  return batch.map((append, i) => toOutcome(append, rows[i]));
}

/** A failed append's error, typed where the database said why. */
function storeError(error: unknown, batch: readonly PendingAppend[]): unknown {
  const code = (error as { code?: string }).code;
  if (code === 'SVA01' || code === 'SVA02') return new AppendNotFirstWrite(batch[0].streamId, code === 'SVA01' ? 'wrote_first' : 'newer_writer');
  // A value the database's types refuse: typed, and (retried alone by the group commit) failing only its own append.
  if (code !== undefined && refusedValueCodes.has(code)) return new EventNotStorable(batch.length === 1 ? batch[0].streamId : '(batch)', code, { cause: error });
  return error;
}

/**
 * How long a reader waits at most before reading again when commits exist that it cannot read yet (an
 * older transaction still runs, anywhere on the server): that transaction's end sends no hint.
 */
const pendingRecheckMs = 40;

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
    const page = types ? (skip ? readPageOfTypesSkipping : readPageOfTypes) : readPageSkipping;
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

  function subscribe(opts: SubscribeOptions): Subscription {
    ensureOpen();
    const batchSize = opts.batchSize ?? 500;
    const poll = opts.pollIntervalMs ?? pollIntervalMs;
    const gatherMs = opts.gatherMs ?? 0;
    const skip = opts.skipMetadata ?? null;
    const types = opts.eventTypes ?? null;
    /** Some events are passed over: pages come from `readPage`, and its passed-over last event is not handed. */
    const filtered = skip !== null || types !== null;
    // Woken by another process's hint, and by this process's commits unless every event of one is passed over.
    const wakes = new WakeHub();
    const passedOver = (event: NewEvent) => (skip !== null && event.metadata?.[skip.key] === skip.value) || (types !== null && !types.includes(event.type));
    const onCommit = (events: readonly (readonly NewEvent[])[] | null) => {
      if (events === null || !events.every((list) => list.every(passedOver))) wakes.notify();
    };
    commitListeners.add(onCommit);
    const abort = new AbortController();
    let position = opts.after ?? logStart;
    let waiters: { target: GlobalPosition; resolve(): void; reject(e: unknown): void }[] = [];
    const settleWaiters = () => {
      waiters = waiters.filter((w) => {
        if (comparePositions(position, w.target) < 0) return true;
        w.resolve();
        return false;
      });
    };

    // Outside any transaction the caller may be in: the loop outlives it.
    const follow = async () => {
      let shortDelay = 0;
      while (!abort.signal.aborted) {
        const generation = wakes.generation;
        let batch: RecordedEvent[];
        let scanned: number;
        let pending = false;
        try {
          ({ events: batch, scanned } = filtered ? await readPage(position, batchSize, skip, types) : await readAll(position, batchSize).then((events) => ({ events, scanned: events.length })));
          const handed = filtered ? batch.filter((e) => e.metadata !== null) : batch;
          if (handed.length > 0) await opts.handle(handed);
          // Nothing readable: has something committed that an older transaction still hides?
          else if (scanned === 0) pending = comparePositions(await lastCommitted(), position) > 0;
        } catch (error) {
          if (abort.signal.aborted || closed) break;
          opts.onError?.(error);
          await pause(Math.min(poll, 1000), abort.signal);
          continue;
        }
        if (batch.length > 0) {
          position = batch[batch.length - 1].globalPosition;
          shortDelay = 0;
          settleWaiters();
          // Caught up: let the next events gather for a moment rather than read them a commit at a time.
          if (scanned < batchSize && gatherMs > 0) await pause(gatherMs, abort.signal);
          continue;
        }
        // Commits wait behind an older transaction, whose end sends no hint: re-read at 5, 10, 20, 40,
        // 40 ... ms until they can be read, rather than at the next poll. A hint still wakes it at once.
        shortDelay = pending ? Math.min(shortDelay === 0 ? 5 : shortDelay * 2, pendingRecheckMs, poll) : 0;
        await wakes.wait(generation, pending ? shortDelay : poll, abort.signal);
      }
    };
    const loop = insideTransaction ? insideTransaction.exit(follow) : follow();

    const subscription: Subscription = {
      get position() {
        return position;
      },
      async caughtUp() {
        const target = await lastCommitted();
        if (comparePositions(position, target) >= 0) return;
        if (abort.signal.aborted) throw new Error('subscription stopped');
        await new Promise<void>((resolve, reject) => waiters.push({ target, resolve, reject }));
      },
      async stop() {
        abort.abort();
        commitListeners.delete(onCommit);
        await loop;
        subscriptions.delete(subscription);
        for (const w of waiters) w.reject(new Error('subscription stopped'));
        waiters = [];
      },
    };
    subscriptions.add(subscription);
    return subscription;
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
