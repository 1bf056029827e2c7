// Failure modes on demand (only when the engine runs with --chaos): the next N completions fail in a chosen way.
import { badRequest } from './errors.ts';

// `crash` dies after the first token; `tear` too, but a stream first gets half of its next SSE frame, and a
// non-streaming body its headers and first bytes (before any token).
export type ChaosMode = 'none' | 'error500' | 'oom' | 'dead' | 'hang' | 'delay' | 'crash' | 'tear';
export const chaosModes: readonly ChaosMode[] = ['none', 'error500', 'oom', 'dead', 'hang', 'delay', 'crash', 'tear'];

export class Chaos {
  mode: ChaosMode = 'none';
  remaining = 0;
  delayMs = 0;

  configure(body: Record<string, unknown>): { mode: ChaosMode; count: number; delay_ms: number } {
    const mode = body.mode as ChaosMode;
    if (!chaosModes.includes(mode)) throw badRequest(`mode must be one of ${chaosModes.join(', ')}`, 'mode');
    const count = body.count ?? (mode === 'dead' ? 1_000_000_000 : 1);
    if (typeof count !== 'number' || !Number.isInteger(count) || count < 0) throw badRequest('count must be a non-negative integer', 'count');
    const delay = body.delay_ms ?? 50;
    if (typeof delay !== 'number' || delay < 0) throw badRequest('delay_ms must be a non-negative number', 'delay_ms');
    this.mode = mode;
    this.remaining = mode === 'none' ? 0 : count;
    this.delayMs = delay;
    return { mode, count: this.remaining, delay_ms: delay };
  }

  /** The mode that applies to the completion now starting (and counts it). */
  take(): ChaosMode {
    if (this.mode === 'none' || this.remaining <= 0) return 'none';
    this.remaining--;
    const mode = this.mode;
    if (this.remaining === 0 && mode !== 'dead') this.mode = 'none';
    return mode;
  }

  get dead(): boolean {
    return this.mode === 'dead' && this.remaining > 0;
  }
}
