// The machine-readable description, generated (by @fastify/swagger in dynamic mode) from the route
// schemas the routes validate with. Two views of one generated document: `/openapi.json`, the public
// surface (`/v1/*` and `/health`), and `/admin/openapi.json`, the routes tagged `admin`.
import type { FastifyInstance } from 'fastify';
import swagger from '@fastify/swagger';
import swaggerUi from '@fastify/swagger-ui';
import { adminTag, sharedSchemas } from './route-schema.ts';

export const interfaceVersion = '0.1.0';

const info = {
  title: 'Base-Model Text Completion Service',
  version: interfaceVersion,
  description: 'Raw text completion against base models, logprobs, residual-stream capture and steering. No chat endpoint.',
};
const adminInfo = {
  title: 'Base-Model Text Completion Service: admin API',
  version: interfaceVersion,
  description: 'Operators only: every operation needs the admin token (Authorization: Bearer <SVC_ADMIN_TOKEN>); this description itself is public.',
};

type Operation = { tags?: string[] };
type Document = { info: unknown; paths: Record<string, Record<string, Operation>>; tags?: { name: string }[] };

/** The operations of one audience: admin-tagged ones, or all the others. */
function view(document: Document, admin: boolean): Document {
  const paths: Document['paths'] = {};
  for (const [path, item] of Object.entries(document.paths)) {
    const operations = Object.entries(item).filter(([, op]) => (op.tags?.includes(adminTag) ?? false) === admin);
    if (operations.length > 0) paths[path] = Object.fromEntries(operations);
  }
  return { ...document, info: admin ? adminInfo : info, paths };
}

/**
 * Registers the generator before any route, so it sees every route as it is added; routes opt out with
 * `schema: { hide: true }`. The documents are built once, on first request, after the app is ready.
 */
export async function registerOpenApi(app: FastifyInstance): Promise<void> {
  for (const schema of sharedSchemas) app.addSchema(schema);
  await app.register(swagger, {
    openapi: {
      openapi: '3.1.0',
      info,
      components: {
        securitySchemes: {
          apiKey: { type: 'http', scheme: 'bearer', description: 'An API key: Authorization: Bearer <API_KEY>.' },
          adminToken: { type: 'http', scheme: 'bearer', description: 'The operators\' token: Authorization: Bearer <SVC_ADMIN_TOKEN>.' },
        },
      },
    },
    // Shared schemas keep their names as components (ErrorEnvelope, not def-0).
    refResolver: { buildLocalReference: (json, _baseUri, _fragment, i) => (typeof json.$id === 'string' ? json.$id : `def-${i}`) },
    // OpenAPI 3.1 is JSON Schema 2020-12: `const` stays `const`.
    convertConstToEnum: false,
  });

  let documents: { public: string; admin: string } | null = null;
  const built = () => {
    if (documents) return documents;
    const whole = app.swagger() as unknown as Document;
    documents = { public: JSON.stringify(view(whole, false)), admin: JSON.stringify(view(whole, true)) };
    return documents;
  };
  app.get('/openapi.json', { schema: { hide: true } }, async (_request, reply) => reply.type('application/json; charset=utf-8').send(built().public));
  app.get('/admin/openapi.json', { schema: { hide: true } }, async (_request, reply) => reply.type('application/json; charset=utf-8').send(built().admin));
  await app.register(swaggerUi, {
    routePrefix: '/swagger',
    uiConfig: { urls: [{ url: '/openapi.json', name: 'public API' }, { url: '/admin/openapi.json', name: 'admin API' }] } as never,
  });
}
