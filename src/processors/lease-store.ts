/**
 * Processors' leases in the SQL database: one row per processor (projection, workflow) in
 * `processor_leases`, in the store's internal schema, saying which process works on it until when.
 * Expiry is judged by the database's clock, so the processes' clocks need not agree. Each takeover
 * bumps the lease's epoch; a holder's writes carry the epoch it took (the fencing token), checked in
 * the transaction that writes them.
 */
import { internalTable, type Queryable, type SqlDatabase } from '../store/index.ts';

/** This runner's lease on these processors expired or was taken by another process: it must write nothing for them. */
export class LeaseLost extends Error {
  override name = 'LeaseLost';
  constructor(readonly names: readonly string[]) {
    super(`lease on ${names.join(', ')} lost`);
  }
}

/** What a holder's write is checked against: its name in the lease table and the epoch of each lease it took. */
export interface Fence {
  holder: string;
  epochs: ReadonlyMap<string, number>;
}

/** A processor's lease as the lease table holds it. */
export interface LeaseRow {
  name: string;
  /** The process that holds or last held it (null: never taken). */
  holder: string | null;
  /** Bumped at each takeover. */
  epoch: number;
  /** Held until then unless renewed (null: never taken). */
  until: Date | null;
  /** Whether it is held now, by the database's clock. */
  held: boolean;
}

export interface LeaseStore {
  /** Creates the lease table if missing, with a row for each of these processors. */
  ensure(db: Queryable, names: readonly string[]): Promise<void>;
  /**
   * Renews `holder`'s leases among `names` and takes those that expired, for `ttlMs` from now; returns
   * the epoch of each lease it holds after the call.
   */
  claim(db: Queryable, names: readonly string[], holder: string, ttlMs: number): Promise<Map<string, number>>;
  /** Lets `holder`'s leases among `names` go at once: another process takes them at its next claim. */
  release(db: Queryable, names: readonly string[], holder: string): Promise<void>;
  /**
   * In the transaction that writes for these processors: checks that the fence's holder still holds
   * each lease, unexpired, at the epoch it took, and keeps it from being taken until `tx` ends; throws
   * `LeaseLost` naming those it does not hold.
   */
  fence(tx: Queryable, names: readonly string[], fence: Fence): Promise<void>;
  /** Every lease row (none on a database that never had leases). */
  list(db: Queryable): Promise<LeaseRow[]>;
}

const quoteLiteral = (text: string) => `'${text.replaceAll("'", "''")}'`;

/** `\d+`'s comments, like every table of the store's (migration 003). */
const comments: [column: string | null, comment: string][] = [
  [null, 'One row per projection or workflow: the process that works on it, until its lease expires. The holder renews it; once expired, another process takes it.'],
  ['name', 'The projection or workflow (its checkpoint name).'],
  ['holder', 'The process holding or last holding the lease (host:pid:instance).'],
  ['epoch', 'Bumped at each takeover; a write is checked against the epoch its process took (the fencing token).'],
  ['expires_at', 'Held until then unless renewed; any process may take it after (the database clock).'],
  ['acquired_at', 'When the current holder took it.'],
  ['renewed_at', 'When the current holder last renewed it.'],
];

export function sqlLeases(db: Pick<SqlDatabase, 'internalSchema'>): LeaseStore {
  const table = internalTable(db, 'processor_leases');
  const exists = async (db: Queryable) => (await db.query<{ t: string | null }>('SELECT to_regclass($1)::text AS t', [table])).rows[0].t !== null;
  return {
    async ensure(db, names) {
      if (!(await exists(db))) {
        await db
          .query(
            `CREATE TABLE IF NOT EXISTS ${table} (
               name text COLLATE "C" PRIMARY KEY,
               holder text,
               epoch bigint NOT NULL DEFAULT 0,
               expires_at timestamptz NOT NULL DEFAULT '-infinity',
               acquired_at timestamptz,
               renewed_at timestamptz)`,
          )
          // Processes starting at once: the loser of the race in the catalogue finds the winner's table.
          .catch((error: { code?: string }) => {
            if (error.code !== '23505' && error.code !== '42P07') throw error;
          });
        for (const [column, comment] of comments) {
          await db.query(`COMMENT ON ${column ? `COLUMN ${table}.${column}` : `TABLE ${table}`} IS ${quoteLiteral(comment)}`);
        }
      }
      await db.query(`INSERT INTO ${table} (name) SELECT unnest($1::text[]) ON CONFLICT (name) DO NOTHING`, [names]);
    },

    async claim(db, names, holder, ttlMs) {
      // SET reads the row as it was: a renewal keeps its epoch, a takeover bumps it. A lease held by
      // another and unexpired is not matched, so it is neither written nor waited on.
      const { rows } = await db.query<{ name: string; epoch: string | number }>(
        `UPDATE ${table} SET
           epoch = CASE WHEN holder = $2 THEN epoch ELSE epoch + 1 END,
           acquired_at = CASE WHEN holder = $2 THEN acquired_at ELSE clock_timestamp() END,
           holder = $2,
           expires_at = clock_timestamp() + $3::int * interval '1 millisecond',
           renewed_at = clock_timestamp()
         WHERE name = ANY($1::text[]) AND (holder = $2 OR expires_at <= clock_timestamp())
         RETURNING name, epoch`,
        [names, holder, Math.ceil(ttlMs)],
      );
      return new Map(rows.map((r) => [r.name, Number(r.epoch)]));
    },

    async release(db, names, holder) {
      await db.query(`UPDATE ${table} SET expires_at = clock_timestamp() WHERE name = ANY($1::text[]) AND holder = $2 AND expires_at > clock_timestamp()`, [names, holder]);
    },

    async fence(tx, names, fence) {
      // FOR SHARE: a takeover (an UPDATE of the row) waits until this transaction ends, so the next
      // holder reads the checkpoint as this one leaves it.
      const { rows } = await tx.query<{ name: string; epoch: string | number }>(
        `SELECT name, epoch FROM ${table} WHERE name = ANY($1::text[]) AND holder = $2 AND expires_at > clock_timestamp() ORDER BY name FOR SHARE`,
        [names, fence.holder],
      );
      const held = new Map(rows.map((r) => [r.name, Number(r.epoch)]));
      const lost = names.filter((name) => held.get(name) !== fence.epochs.get(name));
      if (lost.length > 0) throw new LeaseLost(lost);
    },

    async list(db) {
      if (!(await exists(db))) return [];
      const { rows } = await db.query<{ name: string; holder: string | null; epoch: string | number; expires_at: Date | string | null; held: boolean }>(
        `SELECT name, holder, epoch, CASE WHEN isfinite(expires_at) THEN expires_at END AS expires_at, expires_at > clock_timestamp() AS held
         FROM ${table} ORDER BY name`,
      );
      return rows.map((r) => ({ name: r.name, holder: r.holder, epoch: Number(r.epoch), until: r.expires_at === null ? null : new Date(r.expires_at), held: r.held }));
    },
  };
}
