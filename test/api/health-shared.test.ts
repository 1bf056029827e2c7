/**
 * /health's last completion is the service's, not one process's: two gateway processes on one
 * PostgreSQL (real `svc serve` processes, one reference engine) agree on `last_completion_at` after a
 * completion through either, the one that served nothing learning it from the backend_health
 * projection (kept by the runner from the settlement on the meter stream). PostgreSQL only: the
 * embedded store belongs to one process.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { startGatewayCluster, type GatewayCluster } from '../support/gateway-cluster.ts';
import { issueKey } from '../support/gateway.ts';
import { until } from '../support/until.ts';

const it = suite('/health last_completion_at across two gateways');
const databaseUrl = process.env.DATABASE_URL;

if (!databaseUrl) {
  it('skipped: two gateway processes need PostgreSQL (set DATABASE_URL)', () => {});
} else {
  let cluster: GatewayCluster;
  let key: string;
  it.before(async () => {
    cluster = await startGatewayCluster(databaseUrl, { name: 'health', gateways: 2, ttlMs: 30_000 });
    key = await issueKey(cluster.gateways[0].url, cluster.adminToken);
  });
  it.after(async () => {
    await cluster?.stop();
  });

  interface Backend {
    model_id: string;
    last_completion_at: string | null;
    last_completion_seconds_ago: number | null;
    warm_estimate: string;
  }
  const backendOf = async (url: string): Promise<Backend> => {
    const res = await fetch(`${url}/health`);
    assert.is(res.status, 200);
    const body = (await res.json()) as { backends: Backend[] };
    return body.backends.find((b) => b.model_id === 'ref-byte')!;
  };
  const complete = async (url: string) => {
    const res = await fetch(`${url}/v1/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${key}`, 'content-type': 'application/json' },
      body: JSON.stringify({ prompt: 'health', max_tokens: 2, temperature: 0 }),
    });
    assert.is(res.status, 200);
    await res.arrayBuffer();
  };
  /** Both gateways' last_completion_at once they agree on one later than `after`. */
  const agreed = (after: string | null) =>
    until('both gateways to report the same last completion', async () => {
      const [a, b] = await Promise.all(cluster.gateways.map((g) => backendOf(g.url)));
      const later = a.last_completion_at !== null && (after === null || Date.parse(a.last_completion_at) > Date.parse(after));
      return later && a.last_completion_at === b.last_completion_at ? [a, b] : null;
    }, 15_000, 100);

  it('a completion through gateway 1: gateway 2, which served none, reports the same time', async () => {
    const [g1, g2] = cluster.gateways.map((g) => g.url);
    assert.is((await backendOf(g1)).last_completion_at, null, 'nothing served yet');
    assert.is((await backendOf(g2)).last_completion_at, null);
    const before = Date.now();
    await complete(g1);
    const [a, b] = await agreed(null);
    assert.ok(Date.parse(a.last_completion_at!) >= before - 1000, 'the time of this completion');
    assert.is(b.warm_estimate, 'warm', 'a completion in the idle window makes a static engine warm');
    assert.ok(b.last_completion_seconds_ago !== null && b.last_completion_seconds_ago >= 0);
  });

  it('then one through gateway 2: gateway 1 follows', async () => {
    const [g1, g2] = cluster.gateways.map((g) => g.url);
    const first = (await backendOf(g1)).last_completion_at;
    await new Promise((resolve) => setTimeout(resolve, 20)); // a later settlement time, to the millisecond
    await complete(g2);
    const [a] = await agreed(first);
    assert.ok(Date.parse(a.last_completion_at!) > Date.parse(first!));
  });
}

it.run();
