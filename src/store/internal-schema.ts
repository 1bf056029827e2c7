/**
 * The store's internal schema: `<schema>_internal`, beside the schema analysts query (the store's
 * own, `public` by default). The store's own tables (its migrations, the processors' checkpoints) and
 * the projections' helper tables live there, so the analysts' schema holds only the log and the
 * tables they query. The store's SQL names its tables there qualified, never through the search_path:
 * a rebuild puts its scratch schema first on the path, and an unqualified name must never reach past
 * it into live tables.
 */

export const quoteIdent = (name: string) => `"${name.replaceAll('"', '""')}"`;

/** The SQL expression naming the internal schema of the schema `schema` (an SQL text expression). */
export const internalSchemaOf = (schema: string) => `left(${schema} || '_internal', 63)`;

/** `table` of the store's internal schema, qualified for SQL text (`"public_internal".projection_checkpoints`). */
export const internalTable = (db: { readonly internalSchema: string }, table: string) => `${quoteIdent(db.internalSchema)}.${quoteIdent(table)}`;
