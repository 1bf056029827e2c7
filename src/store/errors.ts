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
