/** Stream `spend-<yyyy-mm-dd>`: the service's daily GPU spend cap, reached at most once a day. */
import { defineEvent, eventCatalogue, Type, type EventOf } from '../src/event-sourcing/index.ts';
import { Day, Instant } from './shapes.ts';

const Micros = Type.Integer({ minimum: 0, description: 'integer micro-units (millionths) of the configured currency unit' });

export const SpendCapReached = defineEvent(
  'SpendCapReached',
  Type.Object(
    {
      day: Day,
      at: Instant,
      /** The day's spend (from the daily_spend projection) when the cap was found reached, and the cap, exactly. */
      spend_micros: Micros,
      cap_micros: Micros,
    },
    { additionalProperties: false },
  ),
  {
    version: 2,
    upcasters: {
      // Version 1 compared floats: its figures, to the micro-unit (money is never a float since).
      1: (data) => {
        const { spend, cap, ...v1 } = data as { spend: number; cap: number };
        return { ...v1, spend_micros: Math.round(spend * 1e6), cap_micros: Math.round(cap * 1e6) };
      },
    },
  },
);

export const spendEvents = eventCatalogue('spend', [SpendCapReached]);
export type SpendEvent = EventOf<typeof SpendCapReached>;
export const spendStream = (day: string): string => `spend-${day}`;
