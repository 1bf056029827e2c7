/** Stream `spend-<yyyy-mm-dd>`: the service's daily GPU spend cap, reached at most once a day. */
import { defineEvent, eventCatalogue, Type, type EventOf } from '../src/event-sourcing/index.ts';

export const SpendCapReached = defineEvent(
  'SpendCapReached',
  Type.Object(
    {
      day: Type.String({ pattern: '^\\d{4}-\\d{2}-\\d{2}$' }),
      /** The day's spend (from the daily_spend projection) when the cap was found reached, and the cap. */
      spend: Type.Number({ minimum: 0 }),
      cap: Type.Number({ minimum: 0 }),
      at: Type.String({ pattern: '^\\d{4}-\\d{2}-\\d{2}T' }),
    },
    { additionalProperties: false },
  ),
);

export const spendEvents = eventCatalogue('spend', [SpendCapReached]);
export type SpendEvent = EventOf<typeof SpendCapReached>;
export const spendStream = (day: string): string => `spend-${day}`;
