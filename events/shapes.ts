/**
 * Shapes every event file shares (an instant, a UTC day, a UTC month, a nullable field) and the UTC
 * day arithmetic on them, written once for the events, the deciders, the workflows and the read side.
 */
import { Type } from '../src/event-sourcing/index.ts';

/** An instant, ISO 8601 in UTC (`2026-11-25T01:30:00.000Z`). */
export const Instant = Type.String({ pattern: '^\\d{4}-\\d{2}-\\d{2}T', description: 'ISO 8601, UTC' });
/** A UTC day, `yyyy-mm-dd`. */
export const Day = Type.String({ pattern: '^\\d{4}-\\d{2}-\\d{2}$' });
/** A UTC month, `yyyy-mm`. */
export const Month = Type.String({ pattern: '^\\d{4}-\\d{2}$', description: 'YYYY-MM, UTC' });
/** The schema, or null. */
export const Nullable = <T extends Parameters<typeof Type.Union>[0][number]>(t: T) => Type.Union([t, Type.Null()]);

const dayMs = 86_400_000;

/** The UTC day `days` days after `day` (before it, for a negative count), both as YYYY-MM-DD. */
export function dayAfter(day: string, days = 1): string {
  return new Date(Date.parse(`${day}T00:00:00Z`) + days * dayMs).toISOString().slice(0, 10);
}

/** The last UTC day asked for by instant, and the span of milliseconds it covers: most calls are of today. */
let lastDay = { from: 0, to: 0, day: '' };

/** The UTC day (`yyyy-mm-dd`) of an instant. */
export function utcDay(at: Date | string): string {
  if (typeof at !== 'string') {
    const ms = at.getTime();
    if (ms >= lastDay.from && ms < lastDay.to) return lastDay.day;
    const from = Math.floor(ms / dayMs) * dayMs;
    if (!Number.isFinite(from)) return at.toISOString().slice(0, 10); // an invalid Date throws as before
    lastDay = { from, to: from + dayMs, day: at.toISOString().slice(0, 10) };
    return lastDay.day;
  }
  // Only an instant written in UTC can be cut as text: 2026-11-25T01:30:00+02:00 is still the 24th in UTC.
  return at.endsWith('Z') ? at.slice(0, 10) : new Date(at).toISOString().slice(0, 10);
}

/** The UTC month (`yyyy-mm`) of an instant. */
export function utcMonth(at: Date | string): string {
  return (typeof at === 'string' ? new Date(at) : at).toISOString().slice(0, 7);
}

/** The month (`yyyy-mm`) of a UTC day (`yyyy-mm-dd`). */
export const monthOfDay = (day: string): string => day.slice(0, 7);

/** Every day of a UTC month (`yyyy-mm`), first to last, as `yyyy-mm-dd`. */
export function daysOfMonth(month: string): string[] {
  const [year, m] = month.split('-').map(Number);
  const count = new Date(Date.UTC(year, m, 0)).getUTCDate();
  return Array.from({ length: count }, (_, i) => `${month}-${String(i + 1).padStart(2, '0')}`);
}

/** Seconds from `now` (epoch ms) until the next UTC day, or month, begins; at least 1. */
export function secondsUntilUtcTurn(now: number, period: 'day' | 'month'): number {
  const at = new Date(now);
  const turn = period === 'day' ? Date.UTC(at.getUTCFullYear(), at.getUTCMonth(), at.getUTCDate() + 1) : Date.UTC(at.getUTCFullYear(), at.getUTCMonth() + 1, 1);
  return Math.max(1, Math.ceil((turn - now) / 1000));
}

/** The instant `ms` milliseconds after `now` (both ISO 8601, UTC). */
export const later = (now: string, ms: number): string => new Date(Date.parse(now) + ms).toISOString();
