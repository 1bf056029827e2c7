/**
 * The meter decider's state (one key's UTC day), its commands and its refusals: the shapes every part
 * of the decider (meter-*.ts) shares.
 */
import type { Rejection } from '../src/event-sourcing/index.ts';
import type { KeyBudgetValues } from '../events/key.ts';
import type { BillingBasisName, MeterOpening, RequestFactsData } from '../events/meter.ts';
import type { KeyStatus } from './key.ts';
import type { StartWindow } from './start-window.ts';

export interface Hold {
  readonly input: number;
  readonly output: number;
  /** The meter day whose stream holds the reservation (another day's when carried over midnight). */
  readonly day: string;
  readonly at: string;
  readonly expiresAt: string;
  /** The process whose slot lease the request runs under; null: it takes a slot of its own. */
  readonly lease: string | null;
}

/** A request waiting for an active slot on a process (events/meter.ts, RequestQueued). */
export interface QueueEntry {
  readonly holder: string;
  readonly at: string;
  readonly expiresAt: string;
}

/** A process's lease on some of the key's active slots (events/meter.ts, SlotsLeased). */
export interface Lease {
  readonly slots: number;
  readonly expiresAt: string;
}

export interface MeterState {
  readonly opened: boolean;
  /** The next day opened from this one: reservations go there. */
  readonly closed: boolean;
  readonly day: string | null;
  /** Charged this month, today included (settlements and expiries). */
  readonly monthInput: number;
  readonly monthOutput: number;
  /** Charged on this stream's day. */
  readonly todayInput: number;
  readonly todayOutput: number;
  /**
   * Open reservations by request id: requests running now. A Map, not a record: every request adds and
   * removes a key of its own, and an object would take a new hidden class each time (BENCHMARKS.md, gateway).
   */
  readonly holds: ReadonlyMap<string, Hold>;
  /** Request starts (epoch ms) of the last minute, oldest first. */
  readonly starts: StartWindow;
  /** Slot leases by holder (a gateway process); one that lapsed counts for nothing. */
  readonly leases: Readonly<Record<string, Lease>>;
  /** Requests waiting for a slot, by request id; one whose process stopped renewing it (lapsed) counts for nothing. */
  readonly queue: Readonly<Record<string, QueueEntry>>;
  /**
   * Request ids whose hold expired on this stream and whose settlement has not come: one that comes
   * late is recorded (LateUsageRecorded), once. Expiries are rare (a dead or starved process), so this stays small.
   */
  readonly expired: readonly string[];
}

export type BudgetName = 'monthly_token_budget' | 'daily_token_budget' | 'monthly_input_token_budget' | 'monthly_output_token_budget';

export type MeterCommand =
  | { type: 'OpenMeter'; opening: MeterOpening; now: string }
  | {
      type: 'Reserve';
      facts: RequestFactsData;
      inputTokens: number;
      /** max_tokens as the request stands (requested, or the injected default, after any deadline clamp). */
      maxTokens: number;
      /** What the client asked for (null: omitted). */
      maxTokensRequested: number | null;
      choices: number;
      budgets: KeyBudgetValues;
      keyStatus: KeyStatus;
      /** maxQueued, when given, is recorded with the reservation (the queue bound is applied by Queue). */
      limits: { maxActive: number; perMinute: number; maxQueued?: number };
      ttlMs: number;
      /** Reserve within this process's slot lease, taking or growing it when it has no room (absent: a slot of its own). */
      lease?: { holder: string; ttlMs: number };
      now: string;
    }
  | { type: 'Renew'; requestId: string; expiresAt: string; now: string }
  /**
   * The holder still runs requests under its slot lease: the lease stands another TTL once less than
   * half of it would be left at the holder's next check (`nextCheckMs` from now); lapsed, it is taken
   * again at the size of what runs under it. Nothing runs under it: nothing (it lapses, or shrinks).
   */
  | { type: 'RenewLease'; holder: string; ttlMs: number; nextCheckMs: number; now: string }
  | {
      type: 'Settle';
      facts: RequestFactsData;
      inputTokens: number;
      outputTokens: number;
      status: number;
      latencyMs: number;
      gpuSeconds: number;
      /** The charge in micro-units (deciders/billing.ts, chargeMicros) and the price per GPU-second it applied (null: nothing was priced). */
      costMicros: number;
      pricePerGpuSecondMicros: number | null;
      /** What the token counts rest on (deciders/billing.ts). */
      basis: BillingBasisName;
      disconnected: boolean;
      /** A stream cut short: output tokens generated (billed) and content frames the client's socket took (absent or null: not a cut-short stream). */
      generatedOutputTokens?: number | null;
      relayedOutputTokens?: number | null;
      /** The settling process, and how many more of the key's requests it has waiting: its lease shrinks to what it still needs. */
      lease?: { holder: string; waiting: number };
      now: string;
    }
  | { type: 'CloseMeter'; nextDay: string; now: string }
  | { type: 'Expire'; requestId: string; now: string }
  | { type: 'ReleaseCarried'; requestId: string; day: string; inputTokens: number; outputTokens: number; now: string }
  | {
      type: 'RecordRejection';
      facts: RequestFactsData;
      code: string;
      status: number;
      inputTokens: number;
      latencyMs: number;
      /** The budget or limit that refused (null: another refusal), and the Retry-After given (null: none). */
      refusedBy: string | null;
      retryAfterSeconds: number | null;
      now: string;
    }
  /** A request refused `at_capacity` waits for a slot, in the holder's queue, if the key's queue has room. */
  | { type: 'Queue'; requestId: string; holder: string; maxQueued: number; ttlMs: number; now: string }
  /** The holder's requests still waiting: their entries stand another TTL. */
  | { type: 'RenewQueued'; holder: string; requestIds: readonly string[]; ttlMs: number; now: string }
  /** A waiting request gave up without a reservation. */
  | { type: 'LeaveQueue'; requestId: string; now: string };

export type MeterRejection = Rejection<'meter_not_opened' | 'meter_closed' | 'key_inactive' | 'duplicate_request' | 'rate_limited' | 'at_capacity' | 'budget_exceeded' | 'queue_full'>;

export const minuteMs = 60_000;
export const budgetNames: readonly BudgetName[] = ['monthly_token_budget', 'daily_token_budget', 'monthly_input_token_budget', 'monthly_output_token_budget'];
