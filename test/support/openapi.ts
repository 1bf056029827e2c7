import * as assert from 'uvu/assert';

/** Headers the contract asks the description to list with each status (X-Request-Id, X-Svc-*, Retry-After, X-Should-Retry). */
const listedHeaders = /^(x-request-id|x-svc-.*|retry-after|x-should-retry)$/i;

/**
 * A response the gateway really gave is described by its document: its status is listed for the route,
 * and so is every contract header it carried. Checks the document against behaviour, not against the
 * helper that wrote it.
 */
export function assertDocumented(doc: any, method: string, path: string, res: Response): void {
  const operation = doc.paths[path]?.[method.toLowerCase()];
  assert.ok(operation, `${method} ${path} is documented`);
  const entry = operation.responses[String(res.status)];
  assert.ok(entry, `${method} ${path} documents status ${res.status}`);
  const documented = new Set(Object.keys(entry.headers ?? {}).map((h) => h.toLowerCase()));
  for (const [name] of res.headers) {
    if (listedHeaders.test(name)) assert.ok(documented.has(name), `${method} ${path} ${res.status} documents the ${name} header it carried`);
  }
}
