/**
 * Typed, versioned events. Each event type is a TypeBox schema with a version; a stream category's
 * catalogue checks every event read from the store (upcasting older versions first), so nothing
 * downstream of the store sees an unchecked `unknown`.
 *
 * Rolling upgrades: processes of two releases share one log, so a catalogue also reads events written
 * by a later release (a version above its own). A new version may only add: a field, optional or not,
 * at any depth. The older reader drops what its schema does not know and checks the rest against its
 * own schema. A breaking change (a field removed, renamed or retyped, a value's meaning changed) is a
 * new event type, never a new version: an older reader would refuse it, or worse, misread it.
 */
import { Compile } from 'typebox/compile';
import { Clean, Clone } from 'typebox/value';
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
  /**
   * Checks a stored event, upcast when an earlier release wrote it, its unknown fields dropped when a
   * later one did; throws EventSchemaViolation when it does not fit.
   */
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
  const firstError = (validator: ReturnType<typeof Compile>, data: unknown): string => {
    const first = [...validator.Errors(data)][0];
    return first ? `${first.instancePath || '/'} ${first.message}` : 'schema mismatch';
  };
  const checked = (type: string, data: unknown, where?: StoredEventShape): Event => {
    const entry = byType.get(type)!;
    if (!entry.validator.Check(data)) throw new EventSchemaViolation(type, firstError(entry.validator, data), where);
    return { type, data } as Event;
  };
  /**
   * An event of a later release (see the module's comment): what this release's schema does not know is
   * dropped, at any depth, and the rest must fit. Only such events pay for the copy and the clean.
   */
  const fromLaterRelease = (stored: StoredEventShape, version: number): Event => {
    const entry = byType.get(stored.type)!;
    const data = Clean(entry.def.schema, Clone(stored.data));
    if (!entry.validator.Check(data)) {
      throw new EventSchemaViolation(
        stored.type,
        `written at schema version ${version} by a later release (this one reads up to ${entry.def.version}) and, without the fields this release does not know, ` +
          `it does not fit this release's schema: ${firstError(entry.validator, data)}. A later version may only add fields; a breaking change must be a new event type`,
        stored,
      );
    }
    return { type: stored.type, data } as Event;
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
      if (!Number.isInteger(version) || version < 1) throw new EventSchemaViolation(stored.type, `schema version ${String(written)} is not a whole number of at least 1`, stored);
      if (version > entry.def.version) return fromLaterRelease(stored, version);
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
