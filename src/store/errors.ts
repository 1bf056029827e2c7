import type { ExpectedVersion } from './types.ts';

/** Optimistic-concurrency conflict: the stream is not at the version the caller expected. */
export class WrongExpectedVersion extends Error {
  override name = 'WrongExpectedVersion';
  constructor(
    readonly streamId: string,
    readonly expected: ExpectedVersion,
    readonly actual: number,
  ) {
    super(`stream ${streamId} is at version ${actual}, expected ${expected}`);
  }
}

/** Event ids already stored somewhere else than this append would put them: not a repeat of it. */
export class DuplicateEventId extends Error {
  override name = 'DuplicateEventId';
  constructor(
    readonly streamId: string,
    readonly actual: number,
  ) {
    super(`append to stream ${streamId} reuses event ids already stored at another place`);
  }
}

/**
 * `store.transaction` did not commit: a statement in it failed, the callback caught that error and
 * returned normally, and the database answered COMMIT with a rollback. Nothing the transaction wrote
 * is stored, its acknowledged appends included.
 */
export class TransactionRolledBack extends Error {
  override name = 'TransactionRolledBack';
  constructor(options?: { cause?: unknown }) {
    super('the transaction was rolled back instead of committed: a statement in it failed and the callback went on (its error was caught), so nothing it wrote, appends included, was stored', options);
  }
}

/** The embedded store's data directory belongs to another running process. */
export class DataDirLocked extends Error {
  override name = 'DataDirLocked';
  constructor(
    readonly dataDir: string,
    readonly holderPid: number,
    message: string,
  ) {
    super(message);
  }
}

export class StoreClosed extends Error {
  override name = 'StoreClosed';
  constructor() {
    super('the event store is closed');
  }
}

/**
 * An append that is not the first write of its transaction (see DESIGN.md): its transaction id was
 * taken before the stream locks that order appends, so it could put a stream's next version before
 * the previous one in the global log. `newer_writer`: a later append of a transaction found one of its
 * streams written by a newer transaction since this one began writing; retry the whole transaction.
 */
export class AppendNotFirstWrite extends Error {
  override name = 'AppendNotFirstWrite';
  constructor(
    readonly streamId: string,
    readonly reason: 'wrote_first' | 'newer_writer',
  ) {
    super(
      reason === 'wrote_first'
        ? `append to stream ${streamId}: an append must be the first write of its transaction (this one wrote something else first)`
        : `append to stream ${streamId}: the stream was written by a newer transaction since this transaction began writing; retry the transaction`,
    );
  }
}

/**
 * The database did not answer in time or the connection broke (the API answers 503). When
 * `outcomeUnknown` is true the statement may have committed: resend the same event ids at the same
 * expected version, which is an idempotent success if it did.
 */
export class StoreUnavailable extends Error {
  override name = 'StoreUnavailable';
  constructor(
    message: string,
    readonly outcomeUnknown: boolean,
    options?: { cause?: unknown },
  ) {
    super(message, options);
  }
}

/** `store.query`, `store.append` (or any store call that needs the database) inside `store.transaction`. */
export class StoreCallInsideTransaction extends Error {
  override name = 'StoreCallInsideTransaction';
  constructor(method: string) {
    super(`store.${method} was called inside store.transaction: use the transaction's own query/append/readAll (the transaction holds the embedded store's only connection, and on PostgreSQL the call would run outside the transaction)`);
  }
}

/**
 * An append refused before it reached the database: its stream id or an event's type holds a character
 * a `text` column cannot keep (U+0000, which PostgreSQL refuses, or a lone UTF-16 surrogate, which the
 * driver would store as U+FFFD). Only this append fails; nothing of it is sent.
 */
export class InvalidEvent extends TypeError {
  override name = 'InvalidEvent';
  constructor(
    readonly streamId: string,
    readonly field: 'stream_id' | 'event_type',
  ) {
    super(`append to stream ${JSON.stringify(streamId)}: the ${field === 'stream_id' ? 'stream id' : 'event type'} holds U+0000 or a lone surrogate, which the store cannot keep`);
  }
}

/**
 * The database refused to store an append's values (PostgreSQL's 22P05, 22021 or 22P02: a character
 * or a value its types cannot hold). The store escapes what `jsonb` refuses and checks stream ids and
 * types before they are sent, so this is a fault of the store, not of the caller's strings.
 */
export class EventNotStorable extends Error {
  override name = 'EventNotStorable';
  constructor(
    readonly streamId: string,
    readonly sqlState: string,
    options?: { cause?: unknown },
  ) {
    super(`append to stream ${JSON.stringify(streamId)}: the database refused its values (${sqlState}): ${(options?.cause as Error | undefined)?.message ?? ''}`, options);
  }
}
