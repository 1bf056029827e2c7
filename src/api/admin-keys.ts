/**
 * The admin API for keys, behind the admin token: issue, list (with this month's usage), show,
 * pause, resume, revoke, change budgets. Requests are checked against the TypeBox schemas of
 * admin-schemas.ts, compiled once.
 */
import type { FastifyInstance, FastifyRequest } from 'fastify';
import type { TSchema } from 'typebox';
import { Compile } from 'typebox/compile';
import { utcMonth } from '../../events/shapes.ts';
import { apiError, type ApiError } from '../errors/index.ts';
import type { KeyService, KeyView } from '../keys/index.ts';
import type { Queryable } from '../store/index.ts';
import { requireAdminToken } from './auth.ts';
import type { AuthFailureLimiter } from './auth-failures.ts';
import { AdminKey as AdminKeySchema, AdminKeyList, AdminKeyWithUsage, budgetFields, ChangeBudgetsRequest, CreateKeyRequest, IssuedKey, PrefixParams, type AdminKey } from './admin-schemas.ts';
import { adminSecurity, adminTag, errorResponses, okResponse } from './route-schema.ts';

export interface AdminKeyRouteOptions {
  keys: KeyService;
  adminToken: string;
  /** Failed authentications per address (shared with the other authenticated routes). */
  authFailures?: AuthFailureLimiter;
  /** Where the projection tables live (the store). */
  db: Queryable;
  /** Resolves once the projections have applied every event committed before the call. */
  projectionsCaughtUp(): Promise<void>;
  /** How long a list waits for the projections before answering from what they hold (default 5 s). */
  catchUpTimeoutMs?: number;
}

const checkCreate = Compile(CreateKeyRequest);
const checkChange = Compile(ChangeBudgetsRequest);
const prefixPattern = /^[0-9a-f]{12}$/;

interface SchemaError {
  keyword: string;
  instancePath: string;
  params: Record<string, unknown>;
  message: string;
}

/** The first problem of a body that failed its schema, as a 400 naming the field. */
function invalidBody(validator: { Errors(value: unknown): Iterable<unknown> }, body: unknown): ApiError {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return invalid('body', 'body: must be a JSON object');
  const errors = [...validator.Errors(body)] as SchemaError[];
  const extra = errors.find((e) => e.keyword === 'additionalProperties');
  if (extra) {
    const name = (extra.params.additionalProperties as string[])[0];
    return invalid(name, `unknown field: ${name}`);
  }
  const missing = errors.find((e) => e.keyword === 'required');
  if (missing) {
    const name = (missing.params.requiredProperties as string[])[0];
    return invalid(name, `${name}: is required`);
  }
  const field = errors.find((e) => e.instancePath !== '');
  if (field) {
    const name = field.instancePath.slice(1).split('/')[0];
    if ((budgetFields as readonly string[]).includes(name)) return invalid(name, `${name}: must be a non-negative integer, or null for unlimited`);
    if (name === 'email') return invalid(name, 'email: must be an e-mail address (at most 254 characters)');
    if (name === 'user_id') return invalid(name, 'user_id: must be a string of 1 to 256 characters, or null');
    return invalid(name, `${name}: ${field.message}`);
  }
  if (errors.some((e) => e.keyword === 'minProperties')) return invalid('body', 'body: name at least one budget to change');
  return invalid('body', 'body: is invalid');
}

function invalid(param: string, message: string): ApiError {
  return apiError('invalid_request', message, { fields: { param } });
}

function validPrefix(request: FastifyRequest): string {
  const prefix = (request.params as { prefix: string }).prefix;
  if (!prefixPattern.test(prefix)) throw invalid('prefix', 'prefix: must be 12 lowercase hex characters');
  return prefix;
}

function notFound(prefix: string): ApiError {
  return apiError('not_found', `no API key with prefix "${prefix}"`);
}

export function adminKeyBody(view: KeyView): AdminKey {
  return {
    prefix: view.prefix,
    key_id: view.keyId,
    email: view.email,
    user_id: view.userId,
    status: view.status,
    ...view.budgets,
    issued_at: view.issuedAt,
  };
}

/** The UTC month a usage figure covers. */
export function usageMonth(now = new Date()): string {
  return utcMonth(now);
}

interface UsageRow {
  key_id: string;
  input_tokens: unknown;
  output_tokens: unknown;
  reserved_tokens: unknown;
  requests: unknown;
}

function usageBody(period: string, row: Partial<UsageRow> | undefined) {
  const input = Number(row?.input_tokens ?? 0);
  const output = Number(row?.output_tokens ?? 0);
  return { period, input_tokens: input, output_tokens: output, total_tokens: input + output, reserved_tokens: Number(row?.reserved_tokens ?? 0), requests: Number(row?.requests ?? 0) };
}

/** The route's entry in the admin OpenAPI document (bodies are checked in the handlers, with messages naming the field). */
function doc(summary: string, response: Record<number, unknown>, withPrefix = false) {
  return { summary, tags: [adminTag], security: adminSecurity, ...(withPrefix ? { params: PrefixParams } : {}), response };
}

export function adminKeyRoutes(app: FastifyInstance, options: AdminKeyRouteOptions): void {
  const { keys, db } = options;
  const catchUpTimeoutMs = options.catchUpTimeoutMs ?? 5000;
  // key_usage belongs to another projection; until it exists, usage reads as zero.
  let usageTable = false;
  const hasUsageTable = async (): Promise<boolean> => {
    if (usageTable) return true;
    const { rows } = await db.query<{ present: boolean }>(`SELECT to_regclass('key_usage') IS NOT NULL AS present`);
    usageTable = rows[0]?.present === true;
    return usageTable;
  };
  const metadata = (request: FastifyRequest) => ({ request_id: request.id, actor: 'admin' });

  app.register(async (admin) => {
    admin.addHook('onRequest', requireAdminToken(options.adminToken, options.authFailures));

    admin.post('/admin/keys', { schema: doc('Issue a key (the full key is shown only in this answer)', { 201: okResponse('The new key', IssuedKey), ...errorResponses(400, 401, 500, 503) }) }, async (request, reply) => {
      const body = request.body;
      if (!checkCreate.Check(body)) throw invalidBody(checkCreate, body);
      const budgets = Object.fromEntries(budgetFields.filter((f) => body[f] !== undefined).map((f) => [f, body[f] ?? null]));
      const issued = await keys.issue({ email: body.email, userId: body.user_id ?? null, budgets }, metadata(request));
      request.keyPrefix = issued.view.prefix;
      return reply.code(201).send({ key: issued.key, ...adminKeyBody(issued.view) });
    });

    admin.get('/admin/keys', { schema: doc('Every key, with its usage so far this UTC month', { 200: okResponse('Keys', AdminKeyList), ...errorResponses(401, 500, 503) }) }, async () => {
      // A list reads the api_keys projection: wait until it has applied every write committed before
      // this request (this process's or another's), so a key just issued is listed.
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([options.projectionsCaughtUp(), new Promise<void>((resolve) => (timer = setTimeout(resolve, catchUpTimeoutMs)))]);
      clearTimeout(timer);
      const period = usageMonth();
      const withUsage = await hasUsageTable();
      const { rows } = await db.query<Record<string, unknown>>(
        `SELECT k.key_id, k.prefix, k.email, k.user_id, k.status, ${budgetFields.map((f) => `k.${f}`).join(', ')}, k.issued_at
         ${withUsage ? ', u.input_tokens, u.output_tokens, u.reserved_tokens, u.requests' : ''}
         FROM api_keys k
         ${withUsage ? `LEFT JOIN key_usage u ON u.key_id = k.key_id AND u.period_kind = 'month' AND u.period = $1` : ''}
         ORDER BY k.issued_at, k.key_id`,
        withUsage ? [period] : [],
      );
      const budget = (v: unknown) => (v === null || v === undefined ? null : Number(v));
      const data = rows.map((r) => ({
        prefix: String(r.prefix),
        key_id: String(r.key_id),
        email: String(r.email),
        user_id: String(r.user_id),
        status: r.status,
        ...Object.fromEntries(budgetFields.map((f) => [f, budget(r[f])])),
        issued_at: new Date(r.issued_at as string).toISOString(),
        usage: usageBody(period, withUsage ? (r as Partial<UsageRow>) : undefined),
      }));
      return { object: 'list', data };
    });

    admin.get('/admin/keys/:prefix', { schema: doc('One key, with its usage so far this UTC month', { 200: okResponse('The key', AdminKeyWithUsage), ...errorResponses(400, 401, 404, 500, 503) }, true) }, async (request) => {
      const prefix = validPrefix(request);
      // One key is read from its stream (fresh), so a read right after a write sees it.
      const view = await keys.get(prefix);
      if (!view) throw notFound(prefix);
      request.keyPrefix = prefix;
      const period = usageMonth();
      const usage = (await hasUsageTable())
        ? (await db.query<UsageRow>(`SELECT input_tokens, output_tokens, reserved_tokens, requests FROM key_usage WHERE key_id = $1 AND period_kind = 'month' AND period = $2`, [prefix, period])).rows[0]
        : undefined;
      return { ...adminKeyBody(view), usage: usageBody(period, usage) };
    });

    const action = (name: 'pause' | 'resume' | 'revoke') =>
      admin.post(`/admin/keys/:prefix/${name}`, { schema: doc(`${name[0].toUpperCase()}${name.slice(1)} a key`, { 200: okResponse('The key', AdminKeySchema), ...errorResponses(400, 401, 404, 409, 500, 503) }, true) }, async (request) => {
        const prefix = validPrefix(request);
        request.keyPrefix = prefix;
        return adminKeyBody(await keys[name](prefix, metadata(request)));
      });
    action('pause');
    action('resume');
    action('revoke');

    admin.patch('/admin/keys/:prefix', { schema: doc("Change a key's budgets (null: unlimited)", { 200: okResponse('The key', AdminKeySchema), ...errorResponses(400, 401, 404, 409, 500, 503) }, true) }, async (request) => {
      const prefix = validPrefix(request);
      const body = request.body;
      if (!checkChange.Check(body)) throw invalidBody(checkChange, body);
      request.keyPrefix = prefix;
      const budgets = Object.fromEntries(budgetFields.filter((f) => body[f] !== undefined).map((f) => [f, body[f] ?? null]));
      return adminKeyBody(await keys.changeBudgets(prefix, budgets, metadata(request)));
    });
  });
}
