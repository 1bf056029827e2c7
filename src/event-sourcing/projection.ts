import type { Projection } from '../processors/index.ts';
import type { BatchedStatement, Queryable, RecordedEvent, StoreTransaction } from '../store/index.ts';
import type { DomainEvent, EventCatalogue } from './events.ts';

/** A stored event after its catalogue checked it: the store's facts plus typed `type` and `data`. */
export type Recorded<Event extends DomainEvent> = Event extends DomainEvent ? Omit<RecordedEvent, 'type' | 'data'> & Event : never;

type HandlerFor<Event extends DomainEvent, Type extends Event['type']> = (event: Recorded<Extract<Event, { type: Type }>>, db: Queryable) => Promise<void>;

/**
 * A projection written as one handler per event type. Events are checked (and upcast) by their
 * catalogues before a handler sees them; handlers must be idempotent (upserts) and only write: inside
 * a store transaction, the statements of a whole batch are collected and sent in one round trip
 * (`queryBatch`) instead of one per statement, and no rows come back to a handler.
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
  return defineBatchProjection<Event>({
    name: definition.name,
    tables: definition.tables,
    events: definition.events,
    eventTypes: Object.keys(handlers) as Event['type'][],
    init: definition.init,
    async apply(events, db) {
      for (const event of events) await handlers[event.type]!(event as never, db);
    },
  });
}

/**
 * A projection written over a whole batch at once: a few set-based statements per batch instead of
 * one per event, for tables that every request writes. `apply` gets the batch's events of
 * `eventTypes`, checked by their catalogues, in global order; like a handler it only writes, and its
 * statements go in one round trip. It must give the rows that applying the events one at a time
 * would give, however the log is cut into batches (the rebuild test holds it to that).
 */
export function defineBatchProjection<Event extends DomainEvent>(definition: {
  name: string;
  tables: readonly string[];
  events: readonly EventCatalogue<any>[];
  eventTypes: readonly Event['type'][];
  init(db: Queryable): Promise<void>;
  apply(events: readonly Recorded<Event>[], db: Queryable): Promise<void>;
}): Projection {
  const catalogueOf = new Map<string, EventCatalogue>();
  for (const type of definition.eventTypes) {
    const catalogue = definition.events.find((c) => c.has(type));
    if (!catalogue) throw new Error(`projection ${definition.name} handles ${type}, which none of its catalogues defines`);
    catalogueOf.set(type, catalogue);
  }
  return {
    name: definition.name,
    tables: definition.tables,
    init: definition.init,
    eventTypes: definition.eventTypes,
    async apply(events, db) {
      const typed = events.filter((e) => catalogueOf.has(e.type)).map((e) => typedEvent(catalogueOf.get(e.type)!, e) as Recorded<Event>);
      if (typed.length === 0) return;
      const writes = batchedWrites(db);
      await definition.apply(typed, writes.db);
      await writes.flush();
    },
  };
}

/**
 * Each stored event checked (and upcast) once per catalogue, however many projections read it: the
 * runner hands every projection of a group the same event objects.
 */
const checked = new WeakMap<EventCatalogue, WeakMap<RecordedEvent, RecordedEvent>>();

function typedEvent(catalogue: EventCatalogue, event: RecordedEvent): RecordedEvent {
  let seen = checked.get(catalogue);
  if (!seen) checked.set(catalogue, (seen = new WeakMap()));
  let typed = seen.get(event);
  if (!typed) seen.set(event, (typed = { ...event, data: catalogue.parse(event).data }));
  return typed;
}

const noRows = {
  get rows(): never {
    throw new Error("a projection handler's writes are sent as one batch: their rows are not returned");
  },
};

/** Collects the handlers' statements when `db` can run them as one batch; otherwise passes them through. */
function batchedWrites(db: Queryable): { db: Queryable; flush(): Promise<void> } {
  const batching = typeof (db as Partial<StoreTransaction>).queryBatch === 'function' ? (db as StoreTransaction) : null;
  if (!batching) return { db, flush: async () => {} };
  const statements: BatchedStatement[] = [];
  return {
    db: {
      query: async (sql: string, params?: unknown[]) => {
        statements.push({ sql, params });
        return noRows as never;
      },
    },
    flush: () => batching.queryBatch(statements.splice(0)),
  };
}
