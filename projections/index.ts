/**
 * Every projection the service runs and `svc projections` knows. Each projection module exports a
 * `Projection` (src/processors): its tables, `init`, and an idempotent `apply`.
 */
import type { Projection } from '../src/processors/index.ts';
import { apiKeys } from './api-keys.ts';
import { dailySpendProjection } from './daily-spend.ts';
import { keyUsageProjection } from './key-usage.ts';
import { meterHoldsProjection } from './meter-holds.ts';
import { usageLedgerProjection } from './usage-ledger.ts';
import { backendHealthProjection } from './backend-health.ts';
import { harvestJobsProjection } from './harvest-jobs.ts';

export { dailySpendProjection, spendOfDay } from './daily-spend.ts';
export { keyUsageProjection, foldKeyUsage, keyUsageOfMonth, usageCounters, type KeyUsageRow } from './key-usage.ts';
export { meterHoldsProjection, expiredHolds, type OpenHold } from './meter-holds.ts';
export { usageLedgerProjection } from './usage-ledger.ts';
export { backendHealthProjection, backendHealthRows, type BackendHealthRow } from './backend-health.ts';
export {
  harvestJobsProjection,
  harvestJobRow,
  harvestShardRows,
  expiredHarvestJobs,
  listHarvestJobs,
  resumableHarvestJobs,
  type HarvestJobRow,
  type HarvestJobStatus,
  type HarvestShardRow,
  type ResumableHarvestRow,
} from './harvest-jobs.ts';

export const projections: readonly Projection[] = [apiKeys, keyUsageProjection, usageLedgerProjection, dailySpendProjection, meterHoldsProjection, backendHealthProjection, harvestJobsProjection];
