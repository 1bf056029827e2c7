/** Reading a test gateway's /metrics, and sending it the small completion the metrics tests count. */
import * as assert from 'uvu/assert';
import type { TestGateway } from './gateway.ts';

/** One small completion through the gateway; its status. */
export async function completeOnce(gw: TestGateway): Promise<number> {
  const res = await fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { ...gw.authHeaders(), 'content-type': 'application/json' }, body: JSON.stringify({ prompt: 'hi', max_tokens: 1 }) });
  await res.arrayBuffer();
  return res.status;
}

/** The Prometheus text of /metrics, read with the admin token. */
export async function scrape(gw: TestGateway): Promise<string> {
  const res = await fetch(`${gw.url}/metrics`, { headers: gw.adminHeaders() });
  assert.is(res.status, 200);
  assert.match(res.headers.get('content-type') ?? '', /^text\/plain; version=0\.0\.4/);
  return res.text();
}

/** The value of one series, by its exact name and labels as printed. */
export function seriesValue(text: string, series: string): number | null {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line === undefined ? null : Number(line.slice(series.length + 1));
}
