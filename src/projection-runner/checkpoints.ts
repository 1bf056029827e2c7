/**
 * Checkpoints of the log's processors (projections and workflows), one row each in
 * `projection_checkpoints`: where a processor has got to, written in the same transaction as its
 * rows. Locking a processor's row (FOR UPDATE) is its lock: runners of it in other processes wait,
 * then find the checkpoint moved and go on from there.
 */
import type { GlobalPosition, Queryable } from '../store/index.ts';

export interface Checkpoint {
  position: GlobalPosition;
  updatedAt: Date;
}

/** Another runner (another process, a rebuild) moved the checkpoint: reload it and go on from there. */
export class CheckpointMoved extends Error {
  override name = 'CheckpointMoved';
}

/** The checkpoints of these processors, by name (one without a row is missing); `lock`: FOR UPDATE, in name order. */
export async function readCheckpoints(db: Queryable, names: readonly string[], lock = false): Promise<Map<string, Checkpoint>> {
  const { rows } = await db.query<{ name: string; transaction_id: string; global_position: string | number; updated_at: Date | string }>(
    `SELECT name, transaction_id::text AS transaction_id, global_position, updated_at FROM projection_checkpoints
     WHERE name = ANY($1::text[])${lock ? ' ORDER BY name FOR UPDATE' : ''}`,
    [names],
  );
  return new Map(
    rows.map((r) => [r.name, { position: { transactionId: Number(r.transaction_id), position: Number(r.global_position) }, updatedAt: new Date(r.updated_at) }]),
  );
}

export async function readCheckpoint(db: Queryable, name: string, lock = false): Promise<Checkpoint | null> {
  return (await readCheckpoints(db, [name], lock)).get(name) ?? null;
}

/** Creates the processor's checkpoint at the log's start, unless it has one. */
export async function ensureCheckpoint(db: Queryable, name: string): Promise<void> {
  await db.query(`INSERT INTO projection_checkpoints (name) VALUES ($1) ON CONFLICT (name) DO NOTHING`, [name]);
}

/** Moves these processors' checkpoints to `position` (their rows locked by the caller's transaction first). */
export async function moveCheckpoints(db: Queryable, names: readonly string[], position: GlobalPosition): Promise<void> {
  await db.query(
    `UPDATE projection_checkpoints SET transaction_id = $2::text::xid8, global_position = $3, updated_at = now() WHERE name = ANY($1::text[])`,
    [names, String(position.transactionId), position.position],
  );
}

/** Sets a processor's checkpoint, creating its row if needed (a rebuild's swap). */
export async function setCheckpoint(db: Queryable, name: string, position: GlobalPosition): Promise<void> {
  await db.query(
    `INSERT INTO projection_checkpoints (name, transaction_id, global_position, updated_at) VALUES ($1, $2::text::xid8, $3, now())
     ON CONFLICT (name) DO UPDATE SET transaction_id = excluded.transaction_id, global_position = excluded.global_position, updated_at = now()`,
    [name, String(position.transactionId), position.position],
  );
}
