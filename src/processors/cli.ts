/** `svc projections status|rebuild [name]`: lag and lease per projection (and the workflows' leases); replay-and-swap with a progress bar. */
import { formatPosition, type EventLog, type EventStore } from '../store/index.ts';
import type { Projection } from './projection.ts';
import { ProjectionRunner, type RebuildProgress } from './projection-runner.ts';
import { sqlCheckpoints } from './checkpoints.ts';
import { sqlLeases, type LeaseRow } from './lease-store.ts';

interface Output {
  write(text: string): unknown;
  isTTY?: boolean;
}

export interface ProjectionsCommandIo {
  /** The SQL store: rows, checkpoints, leases (and the log, unless `log` is given). */
  store: EventStore;
  /** The event log when it is not the store's (EventStoreDB's, SVC_EVENT_LOG=eventstoredb). */
  log?: EventLog;
  projections: readonly Projection[];
  stdout: Output;
  stderr: Output;
}

/** The commands' usage, printed by `runProjectionsCommand` and by `svc` before it opens the store. */
export const projectionsUsage = 'usage: svc projections status [--json]\n       svc projections rebuild [name]\n';

/** Whether `args` name a projections command at all (checked before opening the store). */
export function isProjectionsCommand(args: readonly string[]): boolean {
  return args[0] === 'status' || args[0] === 'rebuild';
}
const count = new Intl.NumberFormat('en-US');

function progressLine(p: RebuildProgress): string {
  const width = 30;
  const fraction = p.total === 0 ? 1 : Math.min(1, p.done / p.total);
  const filled = Math.round(fraction * width);
  const rate = p.elapsedMs > 0 ? (p.done / p.elapsedMs) * 1000 : 0;
  return `${p.name} [${'#'.repeat(filled)}${'-'.repeat(width - filled)}] ${Math.floor(fraction * 100)}% ${count.format(p.done)}/${count.format(p.total)} events ${count.format(Math.round(rate))} events/s`;
}

/** Runs one `svc projections ...` command; returns the process exit code. */
export async function runProjectionsCommand(args: readonly string[], io: ProjectionsCommandIo): Promise<number> {
  const [action, ...rest] = args;
  const runner = new ProjectionRunner(io.log ? { log: io.log, db: io.store, projections: io.projections } : { store: io.store, projections: io.projections });
  if (action === 'status') {
    const statuses = await runner.status();
    // The other leased processors (workflows): their lease and checkpoint; their lag is not counted (they read a few event types).
    const others = (await sqlLeases(io.store).list(io.store)).filter((l) => !runner.names.includes(l.name));
    const otherCheckpoints = await sqlCheckpoints(io.store).read(io.store, others.map((l) => l.name));
    if (rest.includes('--json')) {
      const lease = (l: Pick<LeaseRow, 'holder' | 'until' | 'held'> | undefined) => ({ holder: l?.holder ?? null, lease_until: l?.holder ? l.until : null, lease_held: l?.held ?? false });
      const rows = [
        ...statuses.map((s) => ({ name: s.name, position: formatPosition(s.position), lag: s.lag, updated_at: s.updatedAt, ...lease({ holder: s.holder, until: s.leaseUntil, held: s.leaseHeld }) })),
        ...others.map((l) => ({ name: l.name, position: formatPosition(otherCheckpoints.get(l.name)?.position ?? io.store.start), lag: null, updated_at: otherCheckpoints.get(l.name)?.updatedAt ?? null, ...lease(l) })),
      ];
      io.stdout.write(`${JSON.stringify(rows)}\n`);
      return 0;
    }
    if (statuses.length === 0) {
      io.stdout.write('no projections registered\n');
      return 0;
    }
    // The embedded store's one process holds every lease without a row: no holder is shown.
    const holderOf = (holder: string | null) => holder ?? '-';
    const untilOf = (holder: string | null, until: Date | null, held: boolean) => (!holder || !until ? '-' : `${until.toISOString()}${held ? '' : ' (expired)'}`);
    const rows = [
      ['projection', 'checkpoint', 'lag', 'updated', 'holder', 'until'],
      ...statuses.map((s) => [s.name, formatPosition(s.position), count.format(s.lag), s.updatedAt?.toISOString() ?? 'never', holderOf(s.holder), untilOf(s.holder, s.leaseUntil, s.leaseHeld)]),
      ...others.map((l) => {
        const checkpoint = otherCheckpoints.get(l.name);
        return [l.name, formatPosition(checkpoint?.position ?? io.store.start), '-', checkpoint?.updatedAt.toISOString() ?? 'never', holderOf(l.holder), untilOf(l.holder, l.until, l.held)];
      }),
    ];
    const widths = rows[0].map((_, i) => Math.max(...rows.map((r) => r[i].length)));
    for (const row of rows) io.stdout.write(`${row.map((cell, i) => (i === 2 ? cell.padStart(widths[i]) : cell.padEnd(widths[i]))).join('  ').trimEnd()}\n`);
    return 0;
  }
  if (action === 'rebuild') {
    const names = rest.length > 0 ? rest : runner.names;
    const unknown = names.filter((n) => !runner.names.includes(n));
    if (unknown.length > 0) {
      io.stderr.write(`unknown projection ${unknown.map((n) => `"${n}"`).join(', ')}; known: ${runner.names.join(', ') || 'none'}\n`);
      return 2;
    }
    for (const name of names) {
      let lastShown = -1;
      const report = await runner.rebuild(name, (progress) => {
        if (io.stderr.isTTY) {
          io.stderr.write(`\r${progressLine(progress)}`);
          return;
        }
        // Not a terminal: one line per tenth, so logs stay readable.
        const tenth = progress.total === 0 ? 10 : Math.floor((progress.done / progress.total) * 10);
        if (tenth > lastShown) {
          lastShown = tenth;
          io.stderr.write(`${progressLine(progress)}\n`);
        }
      });
      if (io.stderr.isTTY) io.stderr.write('\n');
      io.stdout.write(`rebuilt ${name}: ${count.format(report.events)} events in ${report.seconds.toFixed(2)} s (${count.format(Math.round(report.eventsPerSecond))} events/s)\n`);
    }
    return 0;
  }
  io.stderr.write(projectionsUsage);
  return 2;
}
