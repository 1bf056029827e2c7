/**
 * Every projection the service runs and `svc projections` knows. Each projection module exports a
 * `Projection` (src/projection-runner): its tables, `init`, and an idempotent `apply`.
 */
import type { Projection } from '../src/projection-runner/index.ts';

export const projections: readonly Projection[] = [];
