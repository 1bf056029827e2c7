/**
 * Stream `meter-<keyId>-<yyyy-mm-dd>`: one key's metering for one UTC day. It opens with the
 * month-to-date balance carried from the key's previous day, so loading a key never reads more than
 * one day of events. Token counts only: never a prompt or a completion.
 */
import { defineEvent, eventCatalogue, Type, type EventOf } from '../src/event-sourcing/index.ts';
import { Day, Instant, Nullable } from './shapes.ts';

const Tokens = Type.Integer({ minimum: 0 });

/** A hold still open when the day changed: it counts against the month and the active cap until released. */
export const CarriedHold = Type.Object(
  {
    request_id: Type.String(),
    day: Type.String(),
    input_tokens: Tokens,
    output_tokens: Tokens,
    at: Instant,
    expires_at: Instant,
    /** The gateway process whose slot lease the hold runs under (null: it takes a slot of its own). */
    lease_holder: Nullable(Type.String()),
  },
  { additionalProperties: false },
);

/**
 * A gateway process's lease on some of the key's active slots: while it stands (until `expires_at`),
 * those slots count as taken for every other process, and the holder may start engine calls in them
 * before their reservation is durable (see SlotsLeased).
 */
export const SlotLease = Type.Object(
  { holder: Type.String(), slots: Type.Integer({ minimum: 0 }), expires_at: Instant },
  { additionalProperties: false },
);

/**
 * A request waiting for one of the key's active slots, on the process that holds it: the contract's
 * "64 queued per key" counts these across processes. An entry its process stops renewing (it died)
 * lapses at `expires_at` and counts for nothing.
 */
export const QueueEntry = Type.Object(
  { request_id: Type.String(), holder: Type.String(), at: Instant, expires_at: Instant },
  { additionalProperties: false },
);

export const MeterOpened = defineEvent(
  'MeterOpened',
  Type.Object(
    {
      key_id: Type.String(),
      day: Day,
      /** Tokens charged this month before this day (settled and expired), from the key's previous meter day. */
      month_input_tokens: Tokens,
      month_output_tokens: Tokens,
      /** The meter day the balance was taken from; null on the month's first metered day. */
      carried_from: Nullable(Type.String()),
      carried_holds: Type.Array(CarriedHold),
      /** Slot leases still standing on the previous day: the slots stay taken across midnight. */
      carried_leases: Type.Array(SlotLease),
      /** Request starts of the last minute (epoch ms), for the rolling rate limit across midnight. */
      recent_starts: Type.Array(Type.Number()),
      /** Queue entries still standing on the previous day: those requests still wait, and count against the bound. */
      carried_queue: Type.Array(QueueEntry),
      at: Instant,
    },
    { additionalProperties: false },
  ),
  {
    version: 3,
    upcasters: {
      // Version 1 knew no slot leases: its holds took a slot each.
      1: (data) => {
        const v1 = data as { carried_holds: object[] };
        return { ...v1, carried_holds: v1.carried_holds.map((h) => ({ ...h, lease_holder: null })), carried_leases: [] };
      },
      // Version 2 knew no queue entries: its requests waited in one process's memory.
      2: (data) => ({ ...(data as object), carried_queue: [] }),
    },
  },
);

/** What every request record carries besides token counts (metadata only). */
const RequestFacts = {
  request_id: Type.String(),
  key_prefix: Type.String(),
  email: Type.String(),
  client_ip: Nullable(Type.String()),
  endpoint: Type.String(),
  model: Nullable(Type.String()),
  /** The request's `user` tag (telemetry only). */
  user: Nullable(Type.String()),
  /** `X-Svc-Workload` when it is `interactive` or `batch`. */
  workload: Nullable(Type.Union([Type.Literal('interactive'), Type.Literal('batch')])),
};

/** The four token budgets a reservation was decided under (null: unlimited). */
const DecidedBudgets = Type.Object(
  {
    monthly_token_budget: Nullable(Tokens),
    daily_token_budget: Nullable(Tokens),
    monthly_input_token_budget: Nullable(Tokens),
    monthly_output_token_budget: Nullable(Tokens),
  },
  { additionalProperties: false },
);
/** The per-key limits a reservation was decided under: active slots, request starts per minute, queued requests. */
const DecidedLimits = Type.Object(
  { max_active: Type.Integer({ minimum: 0 }), per_minute: Type.Integer({ minimum: 0 }), /** null: not given to the decision. */ max_queued: Nullable(Type.Integer({ minimum: 0 })) },
  { additionalProperties: false },
);

export const BudgetReserved = defineEvent(
  'BudgetReserved',
  Type.Object(
    {
      ...RequestFacts,
      /** Prompt tokens of every prompt. */
      input_tokens: Tokens,
      /** max_tokens (after any clamp) × choices. */
      output_tokens: Tokens,
      max_tokens_requested: Nullable(Tokens),
      max_tokens_applied: Tokens,
      choices: Type.Integer({ minimum: 1 }),
      /** Which budget lowered max_tokens, when one did. */
      clamped_by: Nullable(Type.String()),
      at: Instant,
      expires_at: Instant,
      /** The gateway process whose slot lease the request runs under (null: it takes a slot of its own); once that lease lapses, the hold may be expired. */
      lease_holder: Nullable(Type.String()),
      /** The key's token budgets the reservation was decided under (a null budget: unlimited; null: unknown, written before they were recorded). */
      budgets: Nullable(DecidedBudgets),
      /** The per-key limits it was decided under (null: unknown, written before they were recorded). */
      limits: Nullable(DecidedLimits),
    },
    { additionalProperties: false },
  ),
  {
    version: 3,
    upcasters: {
      1: (data) => ({ ...(data as object), lease_holder: null }),
      // Version 2 did not record what it was decided under: unknown, not unlimited.
      2: (data) => ({ ...(data as object), budgets: null, limits: null }),
    },
  },
);

/**
 * A gateway process took, grew or shrank its lease on the key's active slots (`slots` is the lease's
 * size from here on). Taken and grown by a reservation that waits to be durable before its engine
 * call; while it stands, the holder's later reservations that fit in it start their engine
 * call at once, their append alongside: no other process can take those slots meanwhile, so the
 * key's active cap holds at the engine across processes. Shrunk by the holder's settlements to what
 * it runs and has waiting (at least one slot); renewed by the holder's sweep while requests run
 * under it. A lease nobody renews lapses at `expires_at`: its slots are free, and the holds made
 * under it (its process died) may be expired from then on (ReservationExpired).
 */
export const SlotsLeased = defineEvent('SlotsLeased', Type.Object({ ...SlotLease.properties, at: Instant }, { additionalProperties: false }));

/** The holder's standing lease was renewed, its size unchanged: by a reservation made in it while it still had a quarter or more of its time, or by the holder's sweep while requests run under it. */
export const SlotLeaseRenewed = defineEvent('SlotLeaseRenewed', Type.Object({ holder: Type.String(), expires_at: Instant, at: Instant }, { additionalProperties: false }));

export const ReservationRenewed = defineEvent(
  'ReservationRenewed',
  Type.Object({ request_id: Type.String(), expires_at: Instant, at: Instant }, { additionalProperties: false }),
);

/** Where a settlement's token counts come from (deciders/billing.ts). */
export const BillingBasisSchema = Type.Union([Type.Literal('engine_usage'), Type.Literal('relayed_frames'), Type.Literal('whole_hold'), Type.Literal('not_run')]);
const Micros = Type.Integer({ minimum: 0, description: 'integer micro-units (millionths) of the configured currency unit' });

/** What a settlement records (UsageSettled, and LateUsageRecorded when it came after its hold expired). */
const SettlementFacts = {
  ...RequestFacts,
  input_tokens: Tokens,
  output_tokens: Tokens,
  status: Type.Integer(),
  latency_ms: Type.Number({ minimum: 0 }),
  /** Backend time billed for the request (the engine call's wall time). */
  gpu_seconds: Type.Number({ minimum: 0 }),
  /** True when the client left before the end (billed for what was generated). */
  disconnected: Type.Boolean(),
  at: Instant,
  /** The charge, exactly: round half up of gpu_seconds × price_per_gpu_second_micros, once, at settlement. */
  cost_micros: Micros,
  /** The model's price per GPU-second applied, in micro-units (null: settled before prices were recorded). */
  price_per_gpu_second_micros: Nullable(Micros),
  /** What the token counts rest on (null: settled before the basis was recorded). */
  basis: Nullable(BillingBasisSchema),
};

export const UsageSettled = defineEvent(
  'UsageSettled',
  Type.Object(
    {
      ...SettlementFacts,
      /**
       * A stream cut short (`disconnected`): the output tokens the engine generated as far as the gateway
       * knows (its usage frame when it came, else the content frames received), which is what is billed;
       * null for a stream that completed and for a non-streaming request.
       */
      generated_output_tokens: Nullable(Tokens),
      /**
       * A stream cut short: the content frames the client's socket took (written to the response and
       * acknowledged by their write callback before it closed), one token each; at most generated. Null as above.
       */
      relayed_output_tokens: Nullable(Tokens),
    },
    { additionalProperties: false },
  ),
  {
    version: 3,
    upcasters: {
      // Version 1 stored the cost as a float (money is never a float since: exact micro-units, the float
      // dropped) and neither the price nor the basis: both unknown.
      1: (data) => {
        const { cost, ...v1 } = data as { cost: number };
        return { ...v1, cost_micros: Math.round(cost * 1e6), price_per_gpu_second_micros: null, basis: null };
      },
      // Version 2 did not record a cut-short stream's generated and relayed tokens (unknown), and still
      // carried the float beside cost_micros.
      2: (data) => {
        const { cost: _float, ...v2 } = data as { cost?: number };
        return { ...v2, generated_output_tokens: null, relayed_output_tokens: null };
      },
    },
  },
);

/**
 * A settlement that came after its hold had expired on this stream (its process fell more than half a
 * TTL behind on renewals, or its store was down): the real usage, recorded next to what the expiry
 * charged. It charges no tokens (the expiry charged the whole hold, never less than this), but its
 * GPU time was spent: it counts in the day's spend.
 */
export const LateUsageRecorded = defineEvent('LateUsageRecorded', Type.Object(SettlementFacts, { additionalProperties: false }));

export const ReservationExpired = defineEvent(
  'ReservationExpired',
  Type.Object(
    {
      request_id: Type.String(),
      /** What the expiry charges: the whole hold (see the README: the engine may have generated all of it). */
      input_tokens: Tokens,
      output_tokens: Tokens,
      at: Instant,
    },
    { additionalProperties: false },
  ),
);

/** A hold carried into this day was settled (or expired) on its own day: release it here, charging what was charged there. */
export const CarriedHoldReleased = defineEvent(
  'CarriedHoldReleased',
  Type.Object({ request_id: Type.String(), day: Type.String(), input_tokens: Tokens, output_tokens: Tokens, at: Instant }, { additionalProperties: false }),
);

/**
 * A hold still open when this day closed has ended here (settled or expired, the event before this
 * one): the days opened from this one carried it, and must release it (the carried-holds workflow,
 * workflows/carried-holds.ts, sends them ReleaseCarried). Its tokens are what was charged here.
 */
export const CarriedHoldEnded = defineEvent(
  'CarriedHoldEnded',
  Type.Object({ request_id: Type.String(), day: Type.String(), input_tokens: Tokens, output_tokens: Tokens, at: Instant }, { additionalProperties: false }),
);

export const RequestRejected = defineEvent(
  'RequestRejected',
  Type.Object(
    {
      ...RequestFacts,
      code: Type.String(),
      status: Type.Integer(),
      input_tokens: Tokens,
      latency_ms: Type.Number({ minimum: 0 }),
      at: Instant,
      /** The budget (`monthly_token_budget`, ...) or limit (`per_minute`, `max_queued`, `spend_cap`) that refused; null for any other refusal. */
      refused_by: Nullable(Type.String()),
      /** The Retry-After the client was given, in seconds (null: none). */
      retry_after_seconds: Nullable(Type.Integer({ minimum: 0 })),
    },
    { additionalProperties: false },
  ),
  // Version 1 did not record what refused: unknown.
  { version: 2, upcasters: { 1: (data) => ({ ...(data as object), refused_by: null, retry_after_seconds: null }) } },
);

/**
 * A request found none of the key's active slots free and waits for one (its process tries again as
 * slots free). The entry leaves with the request's reservation (BudgetReserved of the same request id)
 * or with QueueLeft; the holder renews it while the request waits (QueueEntriesRenewed).
 */
export const RequestQueued = defineEvent('RequestQueued', QueueEntry);

/** The holder renewed the entries of its requests still waiting (only those that stood: a lapsed one is queued again). */
export const QueueEntriesRenewed = defineEvent(
  'QueueEntriesRenewed',
  Type.Object({ holder: Type.String(), request_ids: Type.Array(Type.String(), { minItems: 1 }), expires_at: Instant, at: Instant }, { additionalProperties: false }),
);

/** A waiting request gave up without a reservation: its client left, its deadline passed, or it was refused. */
export const QueueLeft = defineEvent('QueueLeft', Type.Object({ request_id: Type.String(), at: Instant }, { additionalProperties: false }));

/**
 * The next meter day opened from this day's balance: no reservation lands here after this (settlements
 * and expiries of its holds still do). Appended under the stream's version by the opener, so a
 * reservation decided just before midnight either lands first (and is carried) or is decided again
 * on the new day.
 */
export const MeterClosed = defineEvent(
  'MeterClosed',
  Type.Object({ day: Type.String(), next_day: Type.String(), at: Instant }, { additionalProperties: false }),
);

export const meterEvents = eventCatalogue('meter', [
  MeterOpened,
  MeterClosed,
  BudgetReserved,
  SlotsLeased,
  SlotLeaseRenewed,
  ReservationRenewed,
  UsageSettled,
  LateUsageRecorded,
  ReservationExpired,
  CarriedHoldReleased,
  CarriedHoldEnded,
  RequestRejected,
  RequestQueued,
  QueueEntriesRenewed,
  QueueLeft,
]);
export type MeterEvent =
  | EventOf<typeof SlotsLeased>
  | EventOf<typeof SlotLeaseRenewed>
  | EventOf<typeof MeterOpened>
  | EventOf<typeof MeterClosed>
  | EventOf<typeof BudgetReserved>
  | EventOf<typeof ReservationRenewed>
  | EventOf<typeof UsageSettled>
  | EventOf<typeof LateUsageRecorded>
  | EventOf<typeof ReservationExpired>
  | EventOf<typeof CarriedHoldReleased>
  | EventOf<typeof CarriedHoldEnded>
  | EventOf<typeof RequestRejected>
  | EventOf<typeof RequestQueued>
  | EventOf<typeof QueueEntriesRenewed>
  | EventOf<typeof QueueLeft>;
type MeterOpenedData = EventOf<typeof MeterOpened>['data'];
/** The balance a meter day opens with (no queue carried when absent). */
export type MeterOpening = Omit<MeterOpenedData, 'at' | 'carried_queue'> & { carried_queue?: MeterOpenedData['carried_queue'] };
export type RequestFactsData = Pick<EventOf<typeof UsageSettled>['data'], keyof typeof RequestFacts>;
export type BillingBasisName = EventOf<typeof UsageSettled>['data']['basis'] & string;
export type DecidedBudgetsData = NonNullable<EventOf<typeof BudgetReserved>['data']['budgets']>;

/** `meter-<keyId>-<yyyy-mm-dd>` for the UTC day of `at`. */
export const meterStream = (keyId: string, day: string): string => `meter-${keyId}-${day}`;
/** The key and day of a meter stream's id (null: not a meter stream). */
export function meterStreamParts(streamId: string): { keyId: string; day: string } | null {
  const match = /^meter-(.+)-(\d{4}-\d{2}-\d{2})$/.exec(streamId);
  return match ? { keyId: match[1], day: match[2] } : null;
}
/** A meter day's arithmetic (the UTC day of an instant, the day after), defined in ./shapes.ts. */
export { dayAfter, utcDay } from './shapes.ts';
