/**
 * Typed, versioned events. Each event type is a TypeBox schema with a version; a stream category's
 * catalogue checks every event read from the store (upcasting older versions first), so nothing
 * downstream of the store sees an unchecked `unknown`.
 */
import { Compile } from 'typebox/compile';
import type { Static, TSchema } from 'typebox';

/** An event as deciders and projections see it: a type name and its checked data. */
export interface DomainEvent<Type extends string = string, Data = unknown> {
  readonly type: Type;
  readonly data: Data;
}

/** Turns version N's data into version N + 1's. */
export type Upcaster = (data: any) => unknown;

/** One event type: callable to build an event, with the schema and version it is stored under. */
export interface EventType<Type extends string = string, Schema extends TSchema = TSchema> {
  (data: Static<Schema>): DomainEvent<Type, Static<Schema>>;
  readonly type: Type;
  readonly schema: Schema;
  /** The version new events are written at (1 for a type that never changed). */
  readonly version: number;
  /** `upcasters[k]` turns version k into version k + 1; every version below `version` has one. */
  readonly upcasters: Readonly<Record<number, Upcaster>>;
}

export type EventOf<Def> = Def extends EventType<infer Type, infer Schema> ? DomainEvent<Type, Static<Schema>> : never;

export function defineEvent<const Type extends string, Schema extends TSchema>(
  type: Type,
  schema: Schema,
  options: { version?: number; upcasters?: Record<number, Upcaster> } = {},
): EventType<Type, Schema> {
  const version = options.version ?? 1;
  const upcasters = Object.freeze({ ...options.upcasters });
  for (let v = 1; v < version; v++) {
    if (typeof upcasters[v] !== 'function') throw new Error(`event ${type} is at version ${version} but has no upcaster from version ${v}`);
  }
  const build = (data: Static<Schema>) => ({ type, data });
  return Object.assign(build, { type, schema, version, upcasters }) as EventType<Type, Schema>;
}

/** An event read from the store that its catalogue does not know or whose data breaks its schema. */
export class EventSchemaViolation extends Error {
  override name = 'EventSchemaViolation';
  constructor(
    readonly eventType: string,
    readonly reason: string,
    readonly where?: { streamId?: string; streamVersion?: number },
  ) {
    super(`event ${eventType}${where?.streamId ? ` at ${where.streamId}@${where.streamVersion}` : ''} is not valid: ${reason}`);
  }
}

/** What a catalogue needs of a stored event. */
export interface StoredEventShape {
  type: string;
  data: unknown;
  metadata?: Record<string, unknown>;
  streamId?: string;
  streamVersion?: number;
}

/** The metadata key holding the schema version an event was written at (absent: version 1). */
export const schemaVersionKey = 'schema_version';

export interface EventCatalogue<Event extends DomainEvent = DomainEvent> {
  /** The events' stream category (`key`, `meter`, ...). */
  readonly category: string;
  readonly types: readonly Event['type'][];
  has(type: string): type is Event['type'];
  /** The version an event of this type is written at. */
  versionOf(type: Event['type']): number;
  /** Checks (after upcasting) a stored event; throws EventSchemaViolation when it does not fit. */
  parse(stored: StoredEventShape): Event;
  /** Checks an event about to be appended (a decider bug must not reach the log). */
  check(event: DomainEvent): Event;
}

export function eventCatalogue<const Defs extends readonly EventType<string, TSchema>[]>(category: string, definitions: Defs): EventCatalogue<EventOf<Defs[number]>> {
  type Event = EventOf<Defs[number]>;
  const byType = new Map<string, { def: EventType; validator: ReturnType<typeof Compile> }>();
  for (const def of definitions) {
    if (byType.has(def.type)) throw new Error(`event type ${def.type} is defined twice in the ${category} catalogue`);
    byType.set(def.type, { def, validator: Compile(def.schema) });
  }
  const checked = (type: string, data: unknown, where?: StoredEventShape): Event => {
    const entry = byType.get(type)!;
    if (!entry.validator.Check(data)) {
      const first = [...entry.validator.Errors(data)][0];
      throw new EventSchemaViolation(type, first ? `${first.instancePath || '/'} ${first.message}` : 'schema mismatch', where);
    }
    return { type, data } as Event;
  };
  return {
    category,
    types: definitions.map((d) => d.type) as Event['type'][],
    has: (type): type is Event['type'] => byType.has(type),
    versionOf: (type) => byType.get(type)!.def.version,
    parse(stored) {
      const entry = byType.get(stored.type);
      if (!entry) throw new EventSchemaViolation(stored.type, `not an event of the ${category} category`, stored);
      const written = stored.metadata?.[schemaVersionKey];
      let version = typeof written === 'number' ? written : 1;
      if (!Number.isInteger(version) || version < 1 || version > entry.def.version) {
        throw new EventSchemaViolation(stored.type, `schema version ${String(written)} is not between 1 and ${entry.def.version}`, stored);
      }
      let data = stored.data;
      for (; version < entry.def.version; version++) data = entry.def.upcasters[version](data);
      return checked(stored.type, data, stored);
    },
    check(event) {
      if (!byType.has(event.type)) throw new EventSchemaViolation(event.type, `not an event of the ${category} category`);
      return checked(event.type, event.data);
    },
  };
}
