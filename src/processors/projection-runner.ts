/**
 * The projection runner: each projection reads the global log from its checkpoint and applies
 * batches, writing its rows and its checkpoint in one transaction of the SQL database; catch-up
 * first, then live. It takes the two ports apart (the event log it reads, the SQL database its rows
 * and checkpoints live in) with a checkpoint store that is also its lock, so any log can feed it;
 * positions are the log's, opaque here. One SQL event store can be both. Of several runners on one
 * database (one per process), each projection is applied by the one holding its lease (leases.ts).
 */
import { StoreUnavailable, type EventLog, type GlobalPosition, type RecordedEvent, type SqlDatabase, type Subscription } from '../store/index.ts';
import type { Projection } from './projection.ts';
import { CheckpointMoved, resolveSources, type CheckpointStore, type ProcessorSources, type ResolvedSources } from './checkpoints.ts';
import { LeaseLost } from './lease-store.ts';
import { ProcessorLeases, type LeaseSettings } from './leases.ts';
import { caughtUpWith, logTarget } from './caught-up.ts';
import { rebuildProjection, type RebuildProgress, type RebuildReport } from './projection-rebuild.ts';

export { CheckpointMoved } from './checkpoints.ts';
export type { RebuildProgress, RebuildReport } from './projection-rebuild.ts';

export type ProjectionRunnerOptions = ProcessorSources & ProjectionRunnerSettings;

export interface ProjectionRunnerSettings extends LeaseSettings {
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
  /** Whether this runner is applying it live (started, and holding its lease). */
  live: boolean;
  /** The process holding its lease, or that last held it (null: none ever, or the embedded store, where the one process works on every projection). */
  holder: string | null;
  /** Until when that lease holds unless renewed (null with no holder). */
  leaseUntil: Date | null;
  /** Whether that lease is held now (by the database's clock). */
  leaseHeld: boolean;
}

/** A projection's batch failed (not the store, not a moved checkpoint): the error names it. */
class ProjectionFailed extends Error {
  override name = 'ProjectionFailed';
  constructor(
    readonly projection: string,
    cause: unknown,
  ) {
    super(`projection ${projection} failed to apply a batch: ${(cause as Error)?.message ?? String(cause)}`, { cause });
  }
}

/**
 * Projections applied live together: one reader of the log for all of them, and one transaction per
 * batch that writes every member's rows and moves every member's checkpoint. Each member's position is
 * its own (a projection rebuilt or caught up apart can be ahead): it is given only the events after it.
 */
interface LiveGroup {
  readonly members: readonly Projection[];
  readonly positions: Map<string, GlobalPosition>;
  subscription: Subscription | null;
}

export class ProjectionRunner {
  readonly #sources: ResolvedSources;
  readonly #log: EventLog;
  readonly #db: SqlDatabase;
  readonly #checkpoints: CheckpointStore;
  readonly #projections: Map<string, Projection>;
  readonly #options: ProjectionRunnerOptions;
  /** Projections applied live, in registration order. */
  readonly #live = new Set<string>();
  /** Projections that failed inside a shared group: from then on each runs in a group of its own, so it cannot hold the others back. */
  readonly #alone = new Set<string>();
  #groups: LiveGroup[] = [];
  #regrouping: Promise<void> | null = null;
  #started = false;
  /** Which projections this runner may apply: those whose lease it holds. */
  readonly #leases: ProcessorLeases;

  constructor(options: ProjectionRunnerOptions) {
    this.#sources = resolveSources(options);
    this.#log = this.#sources.log;
    this.#db = this.#sources.db;
    this.#checkpoints = this.#sources.checkpoints;
    this.#options = options;
    this.#projections = new Map(options.projections.map((p) => [p.name, p]));
    if (this.#projections.size !== options.projections.length) throw new Error('projection names must be unique');
    this.#leases = new ProcessorLeases({
      db: this.#db,
      store: this.#sources.leases,
      names: [...this.#projections.keys()],
      settings: options,
      onChange: () => this.#regroupInBackground('leases'),
      onError: (error) => this.#options.onError?.('leases', error),
    });
  }

  /** This runner's name in the lease table. */
  get leaseHolder(): string {
    return this.#leases.holder;
  }

  get names(): string[] {
    return [...this.#projections.keys()];
  }

  /**
   * Creates missing tables and checkpoints, claims the projections' leases, then applies live every
   * projection it holds (catch-up first); the others are taken up if their holder goes.
   */
  async start(): Promise<void> {
    if (this.#started) return;
    this.#started = true;
    for (const projection of this.#projections.values()) await this.#init(projection);
    for (const name of this.#projections.keys()) this.#live.add(name);
    await this.#leases.start();
    await this.#regroup();
  }

  /**
   * Resolves once every live projection has applied every event committed before the call, whichever
   * process applies it: a projection this runner applies is awaited on its reader, any other on its
   * checkpoint (moved by the process holding its lease).
   */
  async caughtUp(): Promise<void> {
    if (!this.#started) return;
    await caughtUpWith({
      names: [...this.#live],
      target: () => logTarget(this.#log),
      log: this.#log,
      reader: (name) => this.#groups.find((g) => g.members.some((p) => p.name === name))?.subscription ?? null,
      stored: (names) => this.#checkpoints.read(this.#db, names),
      settled: () => this.#regrouping,
      running: () => this.#started,
    });
  }

  async status(): Promise<ProjectionStatus[]> {
    const result: ProjectionStatus[] = [];
    const leases = new Map((await this.#sources.leases.list(this.#db).catch(() => [])).map((l) => [l.name, l]));
    for (const name of this.#projections.keys()) {
      const checkpoint = (await this.#checkpoints.read(this.#db, [name]).catch(() => null))?.get(name);
      const position = checkpoint?.position ?? this.#log.start;
      const lease = leases.get(name);
      result.push({
        name,
        position,
        lag: await this.#log.countAfter(position),
        updatedAt: checkpoint?.updatedAt ?? null,
        live: this.#started && this.#live.has(name) && this.#leases.holds(name),
        holder: lease?.holder ?? null,
        leaseUntil: lease?.holder ? lease.until : null,
        leaseHeld: lease?.held ?? false,
      });
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
    const wasLive = this.#live.delete(name);
    if (wasLive) await this.#regroup();
    try {
      return await rebuildProjection(
        { log: this.#log, db: this.#db, sameStore: Boolean(this.#sources.store), checkpoints: this.#checkpoints, batchSize: this.#options.rebuildBatchSize },
        projection,
        onProgress,
      );
    } finally {
      if (wasLive) {
        this.#live.add(name);
        await this.#regroup();
      }
    }
  }

  /** Stops applying, then lets the leases go: another process takes the projections over at its next claim. */
  async stop(): Promise<void> {
    this.#started = false;
    await this.#regroup();
    await this.#leases.stop();
  }

  async #init(projection: Projection): Promise<void> {
    await this.#db.transaction(async (tx) => {
      // Processes starting at once take turns: concurrent CREATE ... IF NOT EXISTS of one table collide (or deadlock).
      await tx.query(`SELECT pg_advisory_xact_lock(hashtext('svc-processor-setup'))`);
      await projection.init(tx);
      await this.#checkpoints.ensure(tx, projection.name);
    });
  }

  /**
   * Stops every live group and, while started, starts them again from their checkpoints as they are
   * now: the live projections together, each that failed among others alone. Calls made while a
   * regroup runs wait for it and then regroup once more.
   */
  #regroup(): Promise<void> {
    const previous = this.#regrouping;
    const regrouping = (async () => {
      await previous;
      const groups = this.#groups;
      this.#groups = [];
      for (const group of groups) await group.subscription?.stop();
      if (!this.#started) return;
      const live = [...this.#projections.values()].filter((p) => this.#live.has(p.name) && this.#leases.holds(p.name));
      const together = live.filter((p) => !this.#alone.has(p.name));
      const memberships = [...(together.length > 0 ? [together] : []), ...live.filter((p) => this.#alone.has(p.name)).map((p) => [p])];
      for (const members of memberships) this.#groups.push(await this.#startGroup(members));
    })().finally(() => {
      if (this.#regrouping === regrouping) this.#regrouping = null;
    });
    this.#regrouping = regrouping;
    return regrouping;
  }

  /** A regroup nothing awaits (a lease changed, a checkpoint moved): one that fails (the database away) is tried again. */
  #regroupInBackground(label: string): void {
    void this.#regroup().catch((error) => {
      this.#options.onError?.(label, error);
      if (this.#started) setTimeout(() => this.#regroupInBackground(label), 1000).unref();
    });
  }

  async #startGroup(members: readonly Projection[]): Promise<LiveGroup> {
    const names = members.map((p) => p.name);
    const label = names.join(',');
    const log = this.#log;
    const checkpoints = await this.#checkpoints.read(this.#db, names);
    const positions = new Map<string, GlobalPosition>(names.map((name) => [name, checkpoints.get(name)?.position ?? log.start]));
    const after = [...positions.values()].reduce((a, b) => (log.comparePositions(a, b) <= 0 ? a : b));
    const group: LiveGroup = { members, positions, subscription: null };
    group.subscription = log.subscribe({
      after,
      batchSize: this.#options.batchSize ?? 500,
      pollIntervalMs: this.#options.pollIntervalMs,
      gatherMs: this.#options.gatherMs ?? 50,
      handle: (events) => this.#applyBatch(group, events),
      onError: (error) => {
        if (error instanceof CheckpointMoved) {
          this.#regroupInBackground(label);
          return;
        }
        if (error instanceof LeaseLost) {
          this.#leases.lost(error.names); // regroups without them
          return;
        }
        if (error instanceof ProjectionFailed) {
          this.#options.onError?.(error.projection, error.cause);
          // Among others, it would hold them back: it goes on alone, from its checkpoint.
          if (members.length > 1 && !this.#alone.has(error.projection)) {
            this.#alone.add(error.projection);
            this.#regroupInBackground(error.projection);
          }
          return;
        }
        this.#options.onError?.(label, error);
      },
    });
    return group;
  }

  /**
   * Applies one batch to every member of the group that has not seen it and moves their checkpoints to
   * the batch's end (never back), atomically; the batch was read once for all of them.
   */
  async #applyBatch(group: LiveGroup, batch: readonly RecordedEvent[]): Promise<void> {
    const last = batch[batch.length - 1].globalPosition;
    const names = group.members.map((p) => p.name);
    const log = this.#log;
    this.#leases.expectHeld(names);
    await this.#db.transaction(async (tx) => {
      // The fence refuses a holder that lost its lease; locking the checkpoints (in one order) serializes runners of these projections.
      await this.#leases.fence(tx, names);
      const stored = await this.#checkpoints.lock(tx, names);
      for (const name of names) {
        const checkpoint = stored.get(name);
        if (!checkpoint || log.comparePositions(checkpoint.position, group.positions.get(name)!) !== 0) throw new CheckpointMoved(`checkpoint of ${name} moved`);
      }
      const advanced: string[] = [];
      for (const projection of group.members) {
        const from = group.positions.get(projection.name)!;
        if (log.comparePositions(from, last) >= 0) continue;
        advanced.push(projection.name);
        const wanted = projection.eventTypes ? new Set(projection.eventTypes) : null;
        const relevant = batch.filter((e) => (wanted === null || wanted.has(e.type)) && log.comparePositions(e.globalPosition, from) > 0);
        if (relevant.length === 0) continue;
        try {
          await projection.apply(relevant, tx);
        } catch (error) {
          // The store failing is no fault of the projection's: the whole batch is tried again as it is.
          throw error instanceof StoreUnavailable ? error : new ProjectionFailed(projection.name, error);
        }
      }
      if (advanced.length > 0) {
        await this.#checkpoints.move(tx, advanced, last);
      }
    });
    for (const name of names) if (log.comparePositions(group.positions.get(name)!, last) < 0) group.positions.set(name, last);
  }
}
