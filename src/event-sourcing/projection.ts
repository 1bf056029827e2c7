import type { Projection } from '../projection-runner/index.ts';
import type { Queryable, RecordedEvent } from '../store/index.ts';
import type { DomainEvent, EventCatalogue } from './events.ts';

/** A stored event after its catalogue checked it: the store's facts plus typed `type` and `data`. */
export type Recorded<Event extends DomainEvent> = Event extends DomainEvent ? Omit<RecordedEvent, 'type' | 'data'> & Event : never;

type HandlerFor<Event extends DomainEvent, Type extends Event['type']> = (event: Recorded<Extract<Event, { type: Type }>>, db: Queryable) => Promise<void>;

/**
 * A projection written as one handler per event type. Events are checked (and upcast) by their
 * catalogues before a handler sees them; handlers must be idempotent (upserts).
 */
export function defineProjection<Event extends DomainEvent>(definition: {
  name: string;
  tables: readonly string[];
  /** The catalogues of every event type it handles. */
  events: readonly EventCatalogue<any>[];
  init(db: Queryable): Promise<void>;
  handlers: { [Type in Event['type']]?: HandlerFor<Event, Type> };
}): Projection {
  const handlers = definition.handlers as Record<string, HandlerFor<Event, Event['type']> | undefined>;
  const eventTypes = Object.keys(handlers);
  const catalogueOf = new Map<string, EventCatalogue>();
  for (const type of eventTypes) {
    const catalogue = definition.events.find((c) => c.has(type));
    if (!catalogue) throw new Error(`projection ${definition.name} handles ${type}, which none of its catalogues defines`);
    catalogueOf.set(type, catalogue);
  }
  return {
    name: definition.name,
    tables: definition.tables,
    init: definition.init,
    eventTypes,
    async apply(events, db) {
      for (const event of events) {
        const handler = handlers[event.type];
        if (!handler) continue;
        const typed = catalogueOf.get(event.type)!.parse(event);
        await handler({ ...event, data: typed.data } as Recorded<any>, db);
      }
    },
  };
}
