/**
 * The PostgreSQL transport: one table in the store's internal schema, claimed with `FOR UPDATE SKIP
 * LOCKED`, over the store's `SqlDatabase` (PostgreSQL, or PGlite for one process with the embedded
 * store). A claimed message is invisible for the visibility timeout, which a heartbeat extends while
 * its handler runs; a consumer that dies lets it lapse and another consumer takes the message. How
 * idle consumers hear of a publish (a bell in process, LISTEN across processes) is postgres-wakeups.ts.
 */
import { randomUUID } from 'node:crypto';
import { internalTable, type SqlDatabase } from '../store/index.ts';
import { TransportLifecycle } from './consumer-stop.ts';
import { Bell, Waker, bells, channelOf, listenDefaults, listenForPublishes } from './postgres-wakeups.ts';
import {
  DispatchLeaseLost,
  concurrencyOf,
  dispatchDefaults,
  retryDelayMs,
  type ConsumeOptions,
  type DispatchConsumer,
  type DispatchHandler,
  type DispatchMessage,
  type DispatchTimingOptions,
  type DispatchTransport,
} from './types.ts';

export interface PostgresDispatchOptions extends DispatchTimingOptions {
  /**
   * A PostgreSQL connection string for one LISTEN connection of this transport: idle consumers then
   * hear other processes' publishes at once. Without it (and on PGlite, where every consumer is in this
   * process) they hear this process's publishes at once and others' at their next poll.
   */
  listenUrl?: string | null;
  /** A claimed message is invisible to other consumers this long unless its heartbeat extends it (default 30,000 ms). */
  visibilityTimeoutMs?: number;
  /** How often a consumer extends the visibility of the messages its handlers hold (default a third of the timeout). */
  heartbeatMs?: number;
  /** An idle consumer looks for messages at least this often, whatever it hears (default 1,000 ms). */
  pollIntervalMs?: number;
}

export const postgresDispatchDefaults = {
  visibilityTimeoutMs: 30_000,
  pollIntervalMs: 1_000,
  ...listenDefaults,
} as const;

interface ClaimedRow {
  id: string | null;
  key: string | null;
  payload: Record<string, unknown> | null;
  deliveries: number | null;
  next_ms: number | null;
}

interface Delivery {
  readonly message: DispatchMessage;
  readonly claim: string;
  readonly controller: AbortController;
  settled?: Promise<void>;
}

/** The transport, with a way to wait for (or fail fast on) its start. */
export interface PostgresDispatchTransport extends DispatchTransport {
  /**
   * Resolves once its table exists (created if missing, under an advisory lock so concurrent starts
   * do not race) and its LISTEN connection listens. Publishing and consuming wait for it by themselves;
   * a start that failed is tried again by the next call.
   */
  ready(): Promise<void>;
}

/** The transport over the store's database. Close it before the database. */
export function postgresTransport(db: SqlDatabase, options: PostgresDispatchOptions = {}): PostgresDispatchTransport {
  const table = internalTable(db, 'dispatch_messages');
  const channel = channelOf(db);
  const visibilityMs = options.visibilityTimeoutMs ?? postgresDispatchDefaults.visibilityTimeoutMs;
  const heartbeatMs = options.heartbeatMs ?? Math.max(1, Math.floor(visibilityMs / 3));
  const pollMs = options.pollIntervalMs ?? postgresDispatchDefaults.pollIntervalMs;
  if (!(heartbeatMs > 0 && heartbeatMs < visibilityMs)) throw new RangeError(`dispatch heartbeatMs (${heartbeatMs}) must be above 0 and below visibilityTimeoutMs (${visibilityMs})`);
  const reportError = (error: unknown, message?: DispatchMessage) => options.onError?.(error, message);
  const lifecycle = new TransportLifecycle(options.stopGraceMs ?? dispatchDefaults.stopGraceMs);

  let bell = bells.get(db);
  if (!bell) bells.set(db, (bell = new Bell()));
  const localBell = bell;
  /** Consumers of this transport: a NOTIFY it hears rings only these (the others' transports listen for themselves). */
  const ownBell = new Bell();
  let listener: { close(): Promise<void> } | null = null;

  async function start(): Promise<void> {
    await db.transaction(async (tx) => {
      await tx.query(`SELECT pg_advisory_xact_lock(hashtext('svc-dispatch-schema'))`);
      // id orders each kind's line (FIFO); the unique (kind, key) is what refuses a second message of a job
      await tx.query(`CREATE TABLE IF NOT EXISTS ${table} (
        id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        kind text COLLATE "C" NOT NULL,
        key text COLLATE "C" NOT NULL,
        payload jsonb NOT NULL,
        deliveries integer NOT NULL DEFAULT 0,
        visible_at timestamptz NOT NULL DEFAULT now(),
        claim uuid,
        published_at timestamptz NOT NULL DEFAULT now(),
        UNIQUE (kind, key)
      )`);
    });
    if (options.listenUrl && !lifecycle.closed) listener = await listenForPublishes(options.listenUrl, channel, (kind) => ownBell.ring(kind), reportError);
    if (lifecycle.closed) await listener?.close();
  }
  let started: Promise<void> | null = null;
  function ready(): Promise<void> {
    started ??= start().catch((error: unknown) => {
      started = null;
      throw error;
    });
    return started;
  }

  const publishSql = `WITH published AS (
      INSERT INTO ${table} (kind, key, payload) VALUES ($1, $2, $3::jsonb) ON CONFLICT (kind, key) DO NOTHING RETURNING id)
    SELECT id::text AS id, pg_notify($4, $1) FROM published`;

  // One statement claims up to $2 visible messages of kind $1, oldest first, skipping those another
  // consumer is claiming this instant, and says when the next message of the kind becomes visible.
  // (The second part reads the table as it was before the update: the rows claimed are left out.)
  const claimSql = `WITH picked AS (
      SELECT id FROM ${table} WHERE kind = $1 AND visible_at <= now() ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED),
    claimed AS (
      UPDATE ${table} AS m SET deliveries = m.deliveries + 1, visible_at = now() + $3::float8 * interval '1 millisecond', claim = $4::uuid
      FROM picked WHERE m.id = picked.id RETURNING m.id, m.key, m.payload, m.deliveries)
    SELECT id::text AS id, key, payload, deliveries, NULL::float8 AS next_ms FROM claimed
    UNION ALL
    SELECT NULL, NULL, NULL, NULL, (extract(epoch FROM min(visible_at) - now()) * 1000)::float8
      FROM ${table} WHERE kind = $1 AND id NOT IN (SELECT id FROM claimed)`;

  const heartbeatSql = `UPDATE ${table} AS m SET visible_at = now() + $3::float8 * interval '1 millisecond'
    FROM unnest($1::bigint[], $2::uuid[]) AS held(id, claim) WHERE m.id = held.id AND m.claim = held.claim
    RETURNING m.id::text AS id`;

  const ackSql = `DELETE FROM ${table} WHERE id = $1 AND claim = $2::uuid`;
  /** Visible again after the backoff; the NOTIFY lets other processes' idle consumers know when. */
  const retrySql = `WITH retried AS (
      UPDATE ${table} SET claim = NULL, visible_at = now() + $3::float8 * interval '1 millisecond' WHERE id = $1 AND claim = $2::uuid RETURNING kind)
    SELECT pg_notify($4, kind) FROM retried`;
  /** Visible again at once for another consumer; $3 takes back deliveries that never reached a handler. */
  const releaseSql = `WITH released AS (
      UPDATE ${table} SET claim = NULL, visible_at = now(), deliveries = deliveries - $3 WHERE id = ANY($1::bigint[]) AND claim = $2::uuid RETURNING kind)
    SELECT pg_notify($4, kind) FROM released`;

  function consume(kind: string, handler: DispatchHandler, consumeOptions?: ConsumeOptions): DispatchConsumer {
    const concurrency = concurrencyOf(consumeOptions);
    const running = new Set<Delivery>();
    const waker = new Waker();
    const offLocal = localBell.on(kind, () => waker.ring());
    const offOwn = ownBell.on(kind, () => waker.ring());
    let stopping = false;

    async function release(ids: string[], claim: string, undelivered: boolean): Promise<void> {
      if (ids.length === 0) return;
      await db.query(releaseSql, [ids, claim, undelivered ? 1 : 0, channel]).catch(reportError);
      localBell.ring(kind);
    }

    function handle(delivery: Delivery): void {
      running.add(delivery);
      const { message, claim, controller } = delivery;
      delivery.settled = Promise.resolve()
        .then(() => handler(message, controller.signal))
        .then(
          async () => {
            await db.query(ackSql, [message.id, claim]);
          },
          async (error: unknown) => {
            reportError(error, message);
            // a consumer that stopped it hands it on at once; a failure waits for its backoff
            if (controller.signal.reason instanceof DispatchLeaseLost) return;
            if (controller.signal.aborted) return release([message.id], claim, false);
            await db.query(retrySql, [message.id, claim, retryDelayMs(message.deliveries, options), channel]);
            localBell.ring(kind); // consumers recompute when it becomes visible
          },
        )
        .catch((error: unknown) => reportError(error, message)) // the message stays claimed: it comes back after the visibility timeout
        .finally(() => {
          running.delete(delivery);
          waker.ring();
        });
    }

    /** Extends the visibility of messages still held under their claims; the ids of those it extended (the others were lost). */
    async function extend(ids: string[], claims: string[]): Promise<Set<string>> {
      const { rows } = await db.query<{ id: string }>(heartbeatSql, [ids, claims, visibilityMs]);
      return new Set(rows.map((r) => r.id));
    }

    /**
     * A claim that took long to come back (a busy process, a slow database) may have lapsed before any
     * heartbeat could extend it, and another consumer may hold the message by now: the claimed rows are
     * extended first, and only those still this claim's are handled.
     */
    async function stillHeld(claimed: ClaimedRow[], claim: string): Promise<ClaimedRow[]> {
      const ids = claimed.map((r) => r.id!);
      const kept = await extend(ids, ids.map(() => claim));
      return claimed.filter((r) => kept.has(r.id!));
    }

    let beating = false;
    const heartbeat = setInterval(() => {
      if (running.size === 0 || beating) return;
      beating = true;
      const held = [...running];
      extend(held.map((d) => d.message.id), held.map((d) => d.claim)).then(
        (kept) => {
          for (const delivery of held) {
            // (one acknowledged since the beat was sent is gone too, and its signal no longer matters)
            if (!kept.has(delivery.message.id) && running.has(delivery)) delivery.controller.abort(new DispatchLeaseLost(delivery.message.id));
          }
        },
        (error: unknown) => reportError(error), // unknown: the next beat tries again, within the timeout
      ).finally(() => (beating = false));
    }, heartbeatMs);

    async function loop(): Promise<void> {
      while (!stopping) {
        try {
          await ready();
          break;
        } catch (error) {
          reportError(error);
          await waker.wait(waker.generation, pollMs);
        }
      }
      while (!stopping) {
        const free = concurrency - running.size;
        const seen = waker.generation;
        if (free <= 0) {
          await waker.wait(seen, pollMs);
          continue;
        }
        let waitMs = pollMs;
        try {
          const claim = randomUUID();
          const sentAt = performance.now();
          const { rows } = await db.query<ClaimedRow>(claimSql, [kind, free, visibilityMs, claim]);
          let claimed = rows.filter((r) => r.id !== null);
          if (stopping) {
            await release(claimed.map((r) => r.id!), claim, true);
            break;
          }
          if (claimed.length > 0 && performance.now() - sentAt > visibilityMs / 2) claimed = await stillHeld(claimed, claim);
          for (const row of claimed.sort((a, b) => Number(a.id) - Number(b.id))) {
            const message: DispatchMessage = Object.freeze({ id: row.id!, kind, key: row.key!, payload: row.payload!, deliveries: Number(row.deliveries) });
            handle({ message, claim, controller: new AbortController() });
          }
          if (claimed.length === free) continue;
          const next = rows.find((r) => r.id === null)?.next_ms;
          // a visible message skipped (another consumer was claiming it): look again shortly
          if (next !== null && next !== undefined) waitMs = Math.min(pollMs, Math.max(5, Math.ceil(next)));
        } catch (error) {
          reportError(error);
        }
        await waker.wait(seen, waitMs);
      }
    }

    const looping = loop();
    return lifecycle.consumer({
      halt() {
        stopping = true;
        waker.ring();
        offLocal();
        offOwn();
      },
      halted: looping,
      running,
      release: () => clearInterval(heartbeat),
    });
  }

  return {
    ...lifecycle.transport('postgres', {
      async publish(kind, key, payload) {
        await ready();
        const { rows } = await db.query<{ id: string }>(publishSql, [kind, key, JSON.stringify(payload), channel]);
        if (rows.length === 0) return false;
        localBell.ring(kind);
        return true;
      },

      consume,

      async release() {
        await started?.catch(() => {});
        await listener?.close();
      },
    }),
    ready,
  };
}
