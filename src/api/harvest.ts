/**
 * The harvest routes: `POST /v1/harvest` (202 with the job), `GET /v1/harvest` (the user's jobs),
 * `GET /v1/harvest/{job_id}` (`?wait=S` long-polls), `DELETE /v1/harvest/{job_id}` (cancel) and
 * `GET /v1/harvest/{job_id}/shards/{n}` (a shard's bytes), `GET /v1/harvest/{job_id}/stats` (the job's
 * stats.safetensors). The rules are in the harvest service.
 */
import type { FastifyInstance, FastifyRequest, onRequestAsyncHookHandler } from 'fastify';
import type { TypeBoxTypeProvider } from '@fastify/type-provider-typebox';
import { Type } from 'typebox';
import { apiError } from '../errors/index.ts';
import { HarvestShardFields } from '../../events/harvest.ts';
import type { HarvestCaller, HarvestRequest, HarvestService } from '../harvest/index.ts';
import { bodyTooLarge } from './body.ts';
import { sendUncompressed } from './compression.ts';
import { apiKeySecurity, errorResponses, okResponse, validationErrorResponse } from './route-schema.ts';

const HarvestRequestBody = Type.Object(
  {
    model: Type.String({ minLength: 1, description: 'Model id (an activation model).' }),
    prompts: Type.Array(Type.String({ minLength: 1 }), { minItems: 1, description: 'Prompts to harvest, in order; at least one, none empty. The count is capped (SVC_HARVEST_MAX_PROMPTS).' }),
    layers: Type.Optional(
      Type.Union([Type.Array(Type.Integer({ minimum: 0 }), { maxItems: 256 }), Type.Literal('all'), Type.Null()], {
        description: 'Layers to capture (ascending order in the shards); "all" or null: every layer.',
      }),
    ),
    shard_size: Type.Optional(Type.Integer({ minimum: 1, maximum: 4096, default: 32, description: 'Prompts per shard file.' })),
    batch_size: Type.Optional(Type.Union([Type.Integer({ minimum: 1, maximum: 64 }), Type.Null()], { description: 'Engine requests in flight; null: the service default (SVC_HARVEST_DEFAULT_BATCH_SIZE).' })),
  },
  { additionalProperties: false },
);

const { shard: _index, ...shardFields } = HarvestShardFields;
/** A shard record (events/harvest.ts's HarvestShard) as the job shows it: `index` for `shard`, and its download path. */
const ShardEntry = Type.Object({
  index: Type.Integer(),
  url: Type.String({ description: 'Download path under the base URL (same key, or a key of the same user).' }),
  ...shardFields,
});

const StatsEntry = Type.Object({
  url: Type.String({ description: 'Download path of stats.safetensors under the base URL (same key, or a key of the same user).' }),
  file: Type.String(),
  bytes: Type.Integer(),
  sha256: Type.String(),
});

export const HarvestJob = Type.Object(
  {
    id: Type.String(),
    job_id: Type.String({ description: 'Equal to `id`.' }),
    object: Type.Literal('harvest.job'),
    status: Type.Union(['pending', 'running', 'succeeded', 'failed', 'cancelled'].map((s) => Type.Literal(s))),
    model: Type.String(),
    checkpoint: Type.String(),
    layers: Type.Array(Type.Integer()),
    shard_size: Type.Integer(),
    batch_size: Type.Integer(),
    created_at: Type.String({ format: 'date-time' }),
    started_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
    finished_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()]),
    progress: Type.Object({
      shards_done: Type.Integer(),
      shards_total: Type.Integer(),
      prompts_done: Type.Integer(),
      prompts_total: Type.Integer(),
      tokens_done: Type.Integer(),
      bytes_done: Type.Integer(),
    }),
    error: Type.Union([Type.Object({ code: Type.String(), message: Type.String() }), Type.Null()]),
    files_removed_at: Type.Union([Type.String({ format: 'date-time' }), Type.Null()], {
      description: "When a failed (or cancelled) job's files were removed: by DELETE of a failed job, or after the retention. Its shards are no longer served.",
    }),
    result: Type.Union([Type.Object({ manifest: Type.Unknown(), manifest_sha256: Type.String(), shards: Type.Array(ShardEntry), stats: Type.Union([StatsEntry, Type.Null()]) }), Type.Null()], {
      description: 'On success: the manifest (manifest.json), each shard with its download path and hash, and the statistics file (stats.safetensors) with its own.',
    }),
  },
  { additionalProperties: false },
);

const JobParams = Type.Object({ job_id: Type.String({ maxLength: 256 }) });
const ShardParams = Type.Object({ job_id: Type.String({ maxLength: 256 }), n: Type.String({ pattern: '^[0-9]{1,9}$', description: 'Shard index, from 0.' }) });
const WaitQuery = Type.Object(
  { wait: Type.Optional(Type.String({ pattern: '^([0-9]|[1-5][0-9]|60)$', description: 'Seconds (0 to 60) to wait for the status or progress to change.' })) },
  { additionalProperties: false },
);
const ListQuery = Type.Object(
  {
    limit: Type.Optional(Type.String({ pattern: '^([1-9]|[1-9][0-9]|100)$', description: 'At most this many jobs (1-100, default 20).' })),
    before: Type.Optional(Type.String({ maxLength: 64, description: 'Jobs submitted before this job id (paging).' })),
  },
  { additionalProperties: false },
);

export interface HarvestRouteOptions {
  service: HarvestService;
  authenticate: onRequestAsyncHookHandler;
}

function callerOf(request: FastifyRequest): HarvestCaller {
  const key = request.apiKey;
  if (!key) throw apiError('invalid_api_key', 'an API key is required');
  return { keyId: key.keyId, prefix: key.prefix, userId: key.userId, email: key.email, budgets: key.budgets };
}

export function harvestRoutes(app: FastifyInstance, options: HarvestRouteOptions): void {
  const { service, authenticate } = options;
  const route = app.withTypeProvider<TypeBoxTypeProvider>();
  const maxBodyBytes = service.settings.maxBodyBytes;
  // A declared length over the cap is refused before a byte of the body is read.
  const bodyCap: onRequestAsyncHookHandler = async (request) => {
    const declared = Number(request.headers['content-length']);
    if (Number.isFinite(declared) && declared > maxBodyBytes) throw bodyTooLarge(maxBodyBytes);
  };

  route.post(
    '/v1/harvest',
    {
      bodyLimit: maxBodyBytes,
      onRequest: [authenticate, bodyCap],
      schema: {
        summary: 'Submit a bulk activation harvest (202: the job, to poll)',
        security: apiKeySecurity,
        body: HarvestRequestBody,
        response: { 202: okResponse('The job, pending or running', HarvestJob), ...errorResponses(400, 401, 413, 429, 500, 503), ...validationErrorResponse },
      },
    },
    async (request, reply) => {
      const view = await service.submit(callerOf(request), request.body as HarvestRequest);
      return reply.code(202).send(view);
    },
  );

  route.get(
    '/v1/harvest',
    {
      onRequest: authenticate,
      schema: {
        summary: "The caller's user's harvest jobs, newest first",
        security: apiKeySecurity,
        querystring: ListQuery,
        response: { 200: okResponse('A list of jobs', Type.Object({ object: Type.Literal('list'), data: Type.Array(HarvestJob) })), ...errorResponses(400, 401, 500, 503) },
      },
    },
    async (request) => {
      const limit = request.query.limit ? Number(request.query.limit) : 20;
      return { object: 'list', data: await service.list(callerOf(request), { limit, before: request.query.before ?? null }) };
    },
  );

  route.get(
    '/v1/harvest/:job_id',
    {
      onRequest: authenticate,
      schema: {
        summary: 'A harvest job: its state, progress, and on success the manifest and shard downloads',
        security: apiKeySecurity,
        params: JobParams,
        querystring: WaitQuery,
        response: {
          200: okResponse('The job', HarvestJob, {
            headers: {
              'X-Svc-Longpoll': Type.String({ description: '`declined`: too many long-polls were waiting; the current state is answered at once (poll again after Retry-After).' }),
              'Retry-After': Type.Integer({ description: 'On a declined long-poll.' }),
            },
          }),
          ...errorResponses(400, 401, 404, 500, 503),
        },
      },
    },
    async (request, reply) => {
      const caller = callerOf(request);
      const wait = request.query.wait === undefined ? 0 : Number(request.query.wait);
      if (wait === 0) return service.get(caller, request.params.job_id);
      const controller = new AbortController();
      reply.raw.once('close', () => controller.abort());
      const { view, declined } = await service.wait(caller, request.params.job_id, wait, controller.signal);
      if (declined) reply.header('x-svc-longpoll', 'declined').header('retry-after', '2');
      return view;
    },
  );

  route.delete(
    '/v1/harvest/:job_id',
    {
      onRequest: authenticate,
      schema: {
        summary: "Cancel a pending or running harvest job, or remove a failed job's files (409 for a succeeded or cancelled job)",
        security: apiKeySecurity,
        params: JobParams,
        response: { 200: okResponse("The cancelled job, or the failed job whose files were removed", HarvestJob), ...errorResponses(400, 401, 404, 409, 500, 503) },
      },
    },
    async (request) => service.cancel(callerOf(request), request.params.job_id),
  );

  route.get(
    '/v1/harvest/:job_id/shards/:n',
    {
      onRequest: authenticate,
      schema: {
        summary: "A written shard's safetensors file, with its length and SHA-256",
        security: apiKeySecurity,
        params: ShardParams,
        response: {
          200: okResponse('The shard file', Type.String({ format: 'binary' }), {
            headers: { 'X-Svc-Sha256': Type.String({ description: 'Hex SHA-256 of the file, as in the manifest.' }) },
            content: { 'application/octet-stream': { schema: Type.String({ format: 'binary' }) } },
          }),
          ...errorResponses(400, 401, 404, 500, 503),
        },
      },
    },
    async (request, reply) => {
      const { stream, size, record } = await service.shard(callerOf(request), request.params.job_id, Number(request.params.n));
      // bf16 activations hardly compress, and the client checks the bytes against their SHA-256 as stored.
      sendUncompressed(reply);
      return reply
        .type('application/octet-stream')
        .header('content-length', String(size))
        .header('x-svc-sha256', record.sha256)
        .header('etag', `"${record.sha256}"`)
        .header('content-disposition', `attachment; filename="${record.file}"`)
        .send(stream);
    },
  );

  route.get(
    '/v1/harvest/:job_id/stats',
    {
      onRequest: authenticate,
      schema: {
        summary: "A succeeded job's statistics (stats.safetensors: per-layer mean and std over the harvested tokens), with its length and SHA-256",
        security: apiKeySecurity,
        params: JobParams,
        response: {
          200: okResponse('The statistics file', Type.String({ format: 'binary' }), {
            headers: { 'X-Svc-Sha256': Type.String({ description: 'Hex SHA-256 of the file, as in the manifest.' }) },
            content: { 'application/octet-stream': { schema: Type.String({ format: 'binary' }) } },
          }),
          ...errorResponses(400, 401, 404, 500, 503),
        },
      },
    },
    async (request, reply) => {
      const { stream, size, file, sha256 } = await service.stats(callerOf(request), request.params.job_id);
      sendUncompressed(reply);
      return reply
        .type('application/octet-stream')
        .header('content-length', String(size))
        .header('x-svc-sha256', sha256)
        .header('etag', `"${sha256}"`)
        .header('content-disposition', `attachment; filename="${file}"`)
        .send(stream);
    },
  );
}
