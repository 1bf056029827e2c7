/**
 * The operators' first look (infra/deploy): the Grafana dashboard's every PromQL metric is one a real
 * gateway's /metrics exposes (a gateway on port 0 with its reference engines, after a completion and a
 * harvest submitted, so the series exist); the harvest gauges follow a job; the compose file is valid
 * YAML whose mounted files exist; Prometheus scrapes the compose file's gateway service on its port,
 * with the admin token compose mounts; Grafana's provisioning names the dashboard's datasource.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';
import { loadSettings } from '../../src/config/index.ts';
import { startTestGateway, json, type TestGateway } from '../support/gateway.ts';
import { scrape, seriesValue } from '../support/metrics.ts';
import { until } from '../support/until.ts';

const deploy = fileURLToPath(new URL('../../infra/deploy/', import.meta.url));
const dashboardFile = join(deploy, 'grafana', 'dashboards', 'gateway.json');
const compose = parse(readFileSync(join(deploy, 'compose.yaml'), 'utf8'), { merge: true });

interface Panel {
  type: string;
  title: string;
  datasource?: { uid: string };
  targets?: { expr: string }[];
}
const dashboard = JSON.parse(readFileSync(dashboardFile, 'utf8')) as { uid: string; panels: Panel[] };
const exprs = dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => ({ panel: p.title, expr: t.expr })));

/** The metric names an expression reads (every one of this project's is svc_...), a histogram's by its base name. */
function metricsOf(expr: string): string[] {
  return [...expr.matchAll(/\b(svc_[a-z0-9_]+)\b/g)].map((m) => m[1].replace(/_(bucket|sum|count)$/, ''));
}

const it = suite('infra/deploy: the Grafana dashboard, Prometheus and the compose file');
const storage = mkdtempSync(join(tmpdir(), 'svc-dashboard-'));
let gw: TestGateway;

it.before(async () => {
  // No harvest worker in this process: a submitted job makes no progress, so its series stand still to be read.
  const harvest = { ...loadSettings({ ...process.env, DATABASE_URL: '', SVC_HARVEST_DIR: storage }).harvest, workers: 0 };
  gw = await startTestGateway({ harvest });
});
it.after(async () => {
  await gw?.stop();
  rmSync(storage, { recursive: true, force: true });
});

it('every metric the dashboard queries is exposed by a real gateway, with series once a completion and a harvest were asked', async () => {
  assert.ok(exprs.length >= 12, 'the dashboard has its panels');
  const completion = await fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: gw.authHeaders({ 'content-type': 'application/json' }), body: JSON.stringify({ model: 'ref-byte', prompt: 'Hello', max_tokens: 2 }) });
  assert.is(completion.status, 200, await completion.clone().text());
  const submitted = await fetch(`${gw.url}/v1/harvest`, { method: 'POST', headers: gw.authHeaders({ 'content-type': 'application/json' }), body: JSON.stringify({ model: 'ref-byte', prompts: ['Hello', 'World', 'Again'], layers: [0] }) });
  assert.is(submitted.status, 202, await submitted.clone().text());
  const job = (await json(submitted)) as { id: string };
  await gw.projectionsCaughtUp();
  const jobSeries = new RegExp(`^svc_harvest_job_prompts\\{job_id="${job.id}",model="ref-byte",status="(pending|running)"\\} (\\d+)$`, 'm');
  const text = await until('the harvest job in the projection', async () => {
    const t = await scrape(gw);
    return jobSeries.test(t) ? t : null;
  }, 30_000, 100);

  const declared = new Set([...text.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1]));
  const sampled = new Set([...text.matchAll(/^([a-z_]+)(?:\{| )/gm)].map((m) => m[1].replace(/_(bucket|sum|count)$/, '')));
  // Series exist only while something is so: a request running or queued for a key.
  const onlyWhileSo = new Set(['svc_key_requests_active', 'svc_key_requests_queued']);
  const used = new Set(exprs.flatMap((e) => metricsOf(e.expr)));
  for (const { panel, expr } of exprs) {
    assert.ok(metricsOf(expr).length > 0, `panel "${panel}" reads a metric of the gateway: ${expr}`);
    for (const name of metricsOf(expr)) {
      assert.ok(declared.has(name), `panel "${panel}": ${name} is not exposed by /metrics`);
      if (!onlyWhileSo.has(name)) assert.ok(sampled.has(name), `panel "${panel}": ${name} has no series after a completion and a harvest`);
    }
  }
  for (const needed of ['svc_http_requests_total', 'svc_added_latency_seconds', 'svc_key_requests_active', 'svc_key_requests_queued', 'svc_backend_breaker_state', 'svc_backend_boot_stage', 'svc_projection_lag_events', 'svc_harvest_job_prompts_done']) {
    assert.ok(used.has(needed), `the dashboard shows ${needed}`);
  }
  for (const panel of dashboard.panels.filter((p) => p.type !== 'row')) assert.is(panel.datasource?.uid, 'prometheus', panel.title);

  // The harvest gauges: the job by status, and its progress (no worker here: none of its 3 prompts done).
  const [, status, prompts] = jobSeries.exec(text)!;
  assert.is(Number(prompts), 3);
  assert.is(seriesValue(text, `svc_harvest_job_prompts_done{job_id="${job.id}",model="ref-byte",status="${status}"}`), 0);
  assert.is(seriesValue(text, `svc_harvest_jobs{status="${status}"}`), 1);
  assert.is(seriesValue(text, 'svc_harvest_jobs{status="succeeded"}'), 0);
  // Cancelled, the job leaves the per-job series and is counted as cancelled.
  const cancelled = await fetch(`${gw.url}/v1/harvest/${job.id}`, { method: 'DELETE', headers: gw.authHeaders() });
  assert.is(cancelled.status, 200, await cancelled.clone().text());
  const after = await until('the job cancelled in the projection', async () => {
    const t = await scrape(gw);
    return seriesValue(t, 'svc_harvest_jobs{status="cancelled"}') === 1 ? t : null;
  }, 30_000, 100);
  assert.is(seriesValue(after, `svc_harvest_jobs{status="${status}"}`), 0);
  assert.not.match(after, new RegExp(`svc_harvest_job_prompts\\{job_id="${job.id}"`));
});

it('the compose file is valid YAML and every file it mounts exists', () => {
  assert.type(compose.services, 'object');
  const mounts: string[] = [];
  for (const [name, service] of Object.entries(compose.services as Record<string, { volumes?: string[] }>)) {
    for (const volume of service.volumes ?? []) {
      const [source] = volume.split(':');
      if (source.startsWith('.')) mounts.push(source);
      else assert.ok(source in (compose.volumes ?? {}), `service ${name}: volume ${source} is declared`);
    }
  }
  // The services under x-svc-service mount through the anchor; the YAML parser merged them in.
  for (const source of mounts) assert.ok(existsSync(resolve(deploy, source)), `${source} exists under infra/deploy`);
  assert.ok(mounts.includes('./grafana/dashboards'), 'the dashboards are mounted');
  for (const service of ['prometheus', 'grafana', 'gateway']) assert.ok(compose.services[service], `a ${service} service`);
  // Files the provisioning and the dashboard expect where compose puts them.
  const grafana = compose.services.grafana as { volumes: string[]; environment: Record<string, string> };
  const dashboardsAt = grafana.volumes.find((v) => v.startsWith('./grafana/dashboards:'))!.split(':')[1];
  const provider = parse(readFileSync(join(deploy, 'grafana', 'provisioning', 'dashboards', 'svc.yaml'), 'utf8'));
  assert.is(provider.providers[0].options.path, dashboardsAt);
  assert.is(grafana.environment.GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH, `${dashboardsAt}/gateway.json`);
  const datasources = parse(readFileSync(join(deploy, 'grafana', 'provisioning', 'datasources', 'prometheus.yaml'), 'utf8'));
  assert.is(datasources.datasources[0].uid, 'prometheus');
  assert.is(new URL(datasources.datasources[0].url).hostname, 'prometheus');
  assert.is(new URL(datasources.datasources[0].url).port, '9090');
});

it('Prometheus scrapes the gateway service on its port, with the admin token compose mounts', () => {
  const prometheus = compose.services.prometheus as { volumes: string[]; configs: { source: string; target: string }[] };
  const configMount = prometheus.volumes.find((v) => v.endsWith('/etc/prometheus/prometheus.yml:ro'))!;
  const config = parse(readFileSync(resolve(deploy, configMount.split(':')[0]), 'utf8'));
  const job = config.scrape_configs.find((j: { job_name: string }) => j.job_name === 'svc-gateway');
  assert.ok(job, 'a scrape job for the gateways');
  assert.is(job.metrics_path, '/metrics');
  const gateway = compose.services.gateway as { environment: Record<string, string> };
  assert.equal(job.dns_sd_configs[0].names, ['gateway']);
  assert.is(String(job.dns_sd_configs[0].port), gateway.environment.PORT, "the gateway's PORT");
  assert.is(gateway.environment.HOST, '0.0.0.0', 'the gateways listen beyond their loopback, for Prometheus');
  // /metrics takes the admin token: the file Prometheus reads is the compose config holding SVC_ADMIN_TOKEN.
  assert.is(job.authorization.type, 'Bearer');
  const token = prometheus.configs.find((c) => c.target === job.authorization.credentials_file);
  assert.ok(token, 'the credentials file is mounted');
  assert.match(compose.configs[token!.source].content, /^\$\{SVC_ADMIN_TOKEN[:?}]/);
  assert.is(dirname(job.authorization.credentials_file), '/etc/prometheus');
});

it.run();
