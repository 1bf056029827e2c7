/**
 * What analysts see through the embedded store's SQL port: schema `analyst`, one view per table of the
 * store's schema (`events` and the projections' tables), without the secrets and personal data the
 * tables hold: no `email`, `secret_sha256` or `client_ip` column, `user_id` replaced by `user_ref` (the
 * first 16 hex digits of its sha256: a user's rows still group together, and a user id that is an
 * e-mail address is not shown), and every jsonb column (the events' `data` and `metadata`) with those
 * keys removed at any depth. Analysts' queries run as role `svc_analyst`, which may read these views
 * and nothing else of the store (SQL port, sql-port.ts).
 */
/** The database the views are made in: the SQL port's snapshot (sql-snapshot.ts). */
export interface ViewsDatabase {
  query<T>(sql: string, params?: unknown[]): Promise<{ rows: T[] }>;
  exec(sql: string): Promise<void>;
}

export const ANALYST_ROLE = 'svc_analyst';
export const ANALYST_SCHEMA = 'analyst';

/** Columns (and JSON keys) analysts never see. */
export const hiddenFields = ['email', 'secret_sha256', 'client_ip', 'user_id'] as const;

const quote = (name: string) => `"${name.replaceAll('"', '""')}"`;
const literal = (text: string) => `'${text.replaceAll("'", "''")}'`;

/** (Re)creates the role, the schema and a view per table; tables added since the last call get theirs. */
export async function refreshAnalystViews(db: ViewsDatabase, storeSchema = 'public'): Promise<void> {
  const { rows } = await db.query<{ table_name: string; column_name: string; data_type: string }>(
    `SELECT c.table_name, c.column_name, c.data_type
       FROM information_schema.columns c
       JOIN information_schema.tables t ON t.table_schema = c.table_schema AND t.table_name = c.table_name
      WHERE c.table_schema = $1 AND t.table_type = 'BASE TABLE'
      ORDER BY c.table_name, c.ordinal_position`,
    [storeSchema],
  );
  const tables = new Map<string, string[]>();
  for (const { table_name: table, column_name: column, data_type: type } of rows) {
    const list = tables.get(table) ?? [];
    tables.set(table, list);
    if (column === 'user_id') list.push(`left(encode(sha256(convert_to(${quote(column)}, 'UTF8')), 'hex'), 16) AS user_ref`);
    else if ((hiddenFields as readonly string[]).includes(column)) continue;
    else if (type === 'jsonb') list.push(`${ANALYST_SCHEMA}.scrub(${quote(column)}) AS ${quote(column)}`);
    else list.push(quote(column));
  }
  const hiddenKeys = hiddenFields.map(literal).join(', ');
  const statements = [
    `DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = ${literal(ANALYST_ROLE)}) THEN CREATE ROLE ${ANALYST_ROLE} NOLOGIN; END IF; END $$`,
    `CREATE SCHEMA IF NOT EXISTS ${ANALYST_SCHEMA}`,
    `CREATE OR REPLACE FUNCTION ${ANALYST_SCHEMA}.scrub(j jsonb) RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
       SELECT CASE jsonb_typeof(j)
         WHEN 'object' THEN (SELECT coalesce(jsonb_object_agg(k, ${ANALYST_SCHEMA}.scrub(v)), '{}'::jsonb) FROM jsonb_each(j) AS e(k, v) WHERE k NOT IN (${hiddenKeys}))
         WHEN 'array' THEN (SELECT coalesce(jsonb_agg(${ANALYST_SCHEMA}.scrub(v) ORDER BY i), '[]'::jsonb) FROM jsonb_array_elements(j) WITH ORDINALITY AS a(v, i))
         ELSE j END $$`,
    ...[...tables].flatMap(([table, columns]) => [
      `DROP VIEW IF EXISTS ${ANALYST_SCHEMA}.${quote(table)}`,
      `CREATE VIEW ${ANALYST_SCHEMA}.${quote(table)} AS SELECT ${columns.join(', ')} FROM ${quote(storeSchema)}.${quote(table)}`,
    ]),
    `GRANT USAGE ON SCHEMA ${ANALYST_SCHEMA} TO ${ANALYST_ROLE}`,
    `GRANT SELECT ON ALL TABLES IN SCHEMA ${ANALYST_SCHEMA} TO ${ANALYST_ROLE}`,
    `GRANT EXECUTE ON FUNCTION ${ANALYST_SCHEMA}.scrub(jsonb) TO ${ANALYST_ROLE}`,
  ];
  // One simple-protocol exec is one transaction: all of it or none.
  await db.exec(statements.join(';\n'));
}
