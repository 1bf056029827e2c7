import { readFileSync, mkdirSync, existsSync, writeFileSync, chmodSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { randomBytes } from 'node:crypto';
import { Compile } from 'typebox/compile';
import { ServiceConfig, type ModelConfig } from './schema.ts';

export * from './schema.ts';
export { packageRoot, svcCommand } from './paths.ts';
import { packageRoot } from './paths.ts';

/** Everything the running service needs to know, resolved once at start. */
export interface Settings {
  port: number;
  host: string;
  dataDir: string;
  databaseUrl: string | null;
  /**
   * Where the event log lives: `sql` (default), in the SQL store beside the rows; `eventstoredb`, in
   * EventStoreDB/KurrentDB at `eventStoreUrl`, the rows, checkpoints and leases staying in the SQL store.
   */
  eventLog: 'sql' | 'eventstoredb';
  /** EVENTSTORE_URL, read only with `eventLog: 'eventstoredb'` (null otherwise). */
  eventStoreUrl: string | null;
  configPath: string | null;
  models: ModelConfig[];
  /** Non-streaming request window; the contract's 14 minutes, shorter only in tests. */
  requestWindowMs: number;
  /** Tokens per second the deadline feasibility check assumes. */
  deadlineTokensPerSecond: number;
  logLevel: string;
  /** Circuit breakers per backend (src/backends): SVC_BREAKER_FAILURE_THRESHOLD, SVC_BREAKER_COOLDOWN_MS, SVC_BREAKER_PROBE_LEASE_MS. */
  breaker: { failureThreshold: number; cooldownMs: number; probeLeaseMs: number };
  /** How long a shutdown waits for in-flight requests before closing their connections. */
  shutdownGraceMs: number;
  /**
   * How long a client may take to send a request: its headers (SVC_HTTP_HEADERS_TIMEOUT_MS) and the
   * whole request, body included (SVC_HTTP_REQUEST_TIMEOUT_MS); past either it is answered 408 and its
   * connection closed. The response is not bounded by these.
   */
  http: { headersTimeoutMs: number; requestTimeoutMs: number };
  /**
   * Failed authentications (API key or admin token) per client address before it is refused 429 for
   * the rest of the window (SVC_AUTH_FAILURE_LIMIT, 0: no limit; SVC_AUTH_FAILURE_WINDOW_MS).
   */
  authFailures: { limit: number; windowMs: number };
  /**
   * Addresses (IPs or CIDRs) of proxies whose X-Forwarded-For names the client (SVC_TRUSTED_PROXIES);
   * empty: the client is the connection's peer.
   */
  trustedProxies: string[];
  /** Budget reservations, rate and concurrency limits per key. Off only to measure the gateway without them. */
  metering: boolean;
  /**
   * This process keeps the analyst tables (the projection runner). Off only to measure what they cost:
   * the tables stand still until a process runs them again, and catch up from their checkpoints then.
   */
  projections: boolean;
  /** A projection's or workflow's lease (src/processors/leases.ts) lasts this long unless its process renews it; another process takes it over after. */
  processorLeaseMs: number;
  /** A hold whose request died (its process was killed) is expired this long after it was made or renewed. */
  reservationTtlMs: number;
  /** A process's slot lease on a key lapses this long after it was last taken or renewed; then its idle slots are free, and the holds made under it are expired (metering). */
  slotLeaseTtlMs: number;
  /** Daily GPU spend (in the configuration's cost units) past which the service answers 429 spend_cap; null: none. */
  dailySpendCap: number | null;
  /** Reference engines (src/platforms): started on the first request unless warm at start, stopped after the idle window, waited out by requests. */
  engines: EngineSettings;
  /** Bulk activation harvests (src/harvest): the submit caps, the workers of this process, leases and long-polls. */
  harvest: HarvestSettings;
}

export interface HarvestSettings {
  /** Where shards, manifests and jobs' prompts are stored; every gateway and worker of a deployment must see the same directory. */
  storageDir: string;
  /** A submit whose Content-Length is above this is 413 before its body is read. */
  maxBodyBytes: number;
  maxPrompts: number;
  /** Estimated tokens (characters / 4) of all prompts together. */
  maxEstimatedTokens: number;
  /** Pending plus running jobs per key. */
  maxRunningPerKey: number;
  /** A pending or running job without progress this long is aged out (failed) at the next submit of its key. */
  staleAfterMs: number;
  /** A failed or cancelled job's files (shards, prompts) are removed this long after it ended (SVC_HARVEST_FAILED_RETENTION_HOURS). */
  failedRetentionMs: number;
  /** batch_size when the request leaves it null. */
  defaultBatchSize: number;
  /** `inprocess` (default), `postgres` (the store's database) or `kafka` (KAFKA_BROKERS): the last two for separate `svc worker` processes. */
  transport: 'inprocess' | 'postgres' | 'kafka';
  /** The Kafka cluster jobs go through when `transport` is `kafka`; null otherwise. */
  kafka: KafkaSettings | null;
  /** Jobs this process works on at once; 0: this process runs no harvest worker (`svc serve --no-workers`). */
  workers: number;
  /** A worker's claim on a job lapses this long after its last renewal; the resumer then dispatches the job again. */
  leaseMs: number;
  /** A job dispatched again this many times without finishing is failed (`worker_lost`). */
  maxRedispatches: number;
  /** `?wait=` long-polls waiting at once, per key and in all (per process); more are answered at once, declined. */
  longPollsPerKey: number;
  longPollsTotal: number;
}

/** The Kafka dispatch transport (src/dispatch/kafka.ts): KAFKA_* and SVC_KAFKA_* variables. */
export interface KafkaSettings {
  brokers: string[];
  ssl: boolean;
  sasl: { mechanism: 'plain' | 'scram-sha-256' | 'scram-sha-512'; username: string; password: string } | null;
  topicPrefix: string;
  groupPrefix: string;
  /** Partitions of a topic the transport creates: at most this many worker processes get jobs at once. */
  partitions: number;
  /** A worker process whose heartbeats stop this long (it died) leaves the group, and its jobs go to the others. */
  sessionTimeoutMs: number;
}

export interface EngineSettings {
  /** Start every reference engine with the gateway instead of on its first request. */
  warmAtStart: boolean;
  /** No request for this long stops a reference engine (scale to zero); 0: never. */
  idleMs: number;
  /** A boot whose engine process has not started within this long is given up: 503 platform_cold_boot. */
  ackTimeoutMs: number;
  /** A boot not over within this long commits the response to 200 and sends keepalive bytes. */
  graceMs: number;
  /** Time between keepalive bytes. */
  keepaliveMs: number;
  /** The cold-boot safety deadline (the contract's 14 minutes). */
  bootDeadlineMs: number;
}

export class ConfigError extends Error {
  override name = 'ConfigError';
}

const checkServiceConfig = Compile(ServiceConfig);

export const defaultConfigPath = join(packageRoot, 'infra', 'config', 'default.json');

/** Validates a models file; the error names the offending field as a JSON path. */
export function parseServiceConfig(raw: unknown, source: string): ServiceConfig {
  if (!checkServiceConfig.Check(raw)) {
    const first = [...checkServiceConfig.Errors(raw)].sort((a, b) => b.instancePath.length - a.instancePath.length)[0];
    const field = first ? fieldName(first.instancePath, first.params) : '(root)';
    throw new ConfigError(`invalid configuration in ${source}: field ${field} ${first?.message ?? 'is invalid'}`);
  }
  const config = raw as ServiceConfig;
  const ids = new Set<string>();
  config.models.forEach((model, i) => {
    if (ids.has(model.id)) throw new ConfigError(`invalid configuration in ${source}: field models[${i}].id duplicates "${model.id}"`);
    ids.add(model.id);
    if (model.engine !== 'reference' && !/^https?:\/\//.test(model.engine)) {
      throw new ConfigError(`invalid configuration in ${source}: field models[${i}].engine must be "reference" or an http(s) URL`);
    }
    if (model.engine === 'reference' && !model.architecture) {
      throw new ConfigError(`invalid configuration in ${source}: field models[${i}].architecture is required for a reference engine`);
    }
    if (model.architecture && model.architecture.d_model % model.architecture.n_heads !== 0) {
      throw new ConfigError(`invalid configuration in ${source}: field models[${i}].architecture.n_heads must divide d_model`);
    }
    const act = model.activations;
    if (act && model.architecture && act.d_model != null && act.d_model !== model.architecture.d_model) {
      throw new ConfigError(`invalid configuration in ${source}: field models[${i}].activations.d_model differs from architecture.d_model`);
    }
    if (act?.max_capture_bytes !== undefined && (act.n_layers === null || (act.d_model ?? model.architecture?.d_model ?? null) === null)) {
      throw new ConfigError(`invalid configuration in ${source}: field models[${i}].activations.max_capture_bytes needs n_layers and d_model (activations.d_model or architecture.d_model) to size a capture`);
    }
  });
  defaultModel(config.models, source);
  return config;
}

/** Live models are listed (`GET /v1/models`); staging models are served when named but not listed. */
export function isListed(model: ModelConfig): boolean {
  return model.status !== 'staging';
}

/** The one default-model rule: exactly one model has `default: true`, and it is a listed (live) model. */
export function defaultModel(models: readonly ModelConfig[], source = 'the model list'): ModelConfig {
  const defaults = models.filter((m) => m.default === true);
  const problem =
    defaults.length !== 1 ? `found ${defaults.length}` : !isListed(defaults[0]) ? `"${defaults[0].id}" is a staging model` : null;
  if (problem) throw new ConfigError(`invalid configuration in ${source}: field models[].default must mark exactly one live default model (${problem})`);
  return defaults[0];
}

function fieldName(instancePath: string, params: Record<string, unknown>): string {
  const parts = instancePath.split('/').slice(1);
  const extra = params as { additionalProperties?: string[]; requiredProperties?: string[] };
  if (extra.additionalProperties?.length) parts.push(extra.additionalProperties[0]);
  if (extra.requiredProperties?.length) parts.push(extra.requiredProperties[0]);
  return parts.reduce((acc, p) => (/^\d+$/.test(p) ? `${acc}[${p}]` : acc ? `${acc}.${p}` : p), '') || '(root)';
}

export function loadServiceConfig(path: string | null): ServiceConfig {
  const source = path ?? defaultConfigPath;
  let text: string;
  try {
    text = readFileSync(source, 'utf8');
  } catch (err) {
    throw new ConfigError(`cannot read configuration file ${source}: ${(err as Error).message}`);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch (err) {
    throw new ConfigError(`configuration file ${source} is not valid JSON: ${(err as Error).message}`);
  }
  return parseServiceConfig(raw, source);
}

function intFromEnv(env: NodeJS.ProcessEnv, name: string, fallback: number, min: number, max: number): number {
  const value = env[name];
  if (value === undefined || value === '') return fallback;
  const n = Number(value);
  if (!Number.isInteger(n) || n < min || n > max) throw new ConfigError(`invalid environment variable ${name}: "${value}" is not an integer in ${min}..${max}`);
  return n;
}

function switchFromEnv(env: NodeJS.ProcessEnv, name: string, fallback: boolean): boolean {
  const value = env[name];
  if (value === undefined || value === '') return fallback;
  if (value === 'on') return true;
  if (value === 'off') return false;
  throw new ConfigError(`invalid environment variable ${name}: "${value}" is not on or off`);
}

function numberFromEnv(env: NodeJS.ProcessEnv, name: string): number | null {
  const value = env[name];
  if (value === undefined || value === '') return null;
  const n = Number(value);
  if (!Number.isFinite(n) || n < 0) throw new ConfigError(`invalid environment variable ${name}: "${value}" is not a non-negative number`);
  return n;
}

function harvestTransportFromEnv(env: NodeJS.ProcessEnv): HarvestSettings['transport'] {
  const value = env.SVC_HARVEST_TRANSPORT || 'inprocess';
  if (value !== 'inprocess' && value !== 'postgres' && value !== 'kafka') throw new ConfigError(`invalid environment variable SVC_HARVEST_TRANSPORT: "${value}" is not inprocess, postgres or kafka`);
  if (value === 'kafka' && !env.KAFKA_BROKERS) throw new ConfigError('SVC_HARVEST_TRANSPORT=kafka needs KAFKA_BROKERS: host:port of one or more brokers, comma-separated');
  return value;
}

function eventLogFromEnv(env: NodeJS.ProcessEnv): Pick<Settings, 'eventLog' | 'eventStoreUrl'> {
  const value = env.SVC_EVENT_LOG || 'sql';
  if (value !== 'sql' && value !== 'eventstoredb') throw new ConfigError(`invalid environment variable SVC_EVENT_LOG: "${value}" is not sql or eventstoredb`);
  if (value === 'sql') return { eventLog: 'sql', eventStoreUrl: null };
  const url = env.EVENTSTORE_URL;
  if (!url) throw new ConfigError('SVC_EVENT_LOG=eventstoredb needs EVENTSTORE_URL: the server\'s connection string, e.g. esdb://127.0.0.1:2113?tls=false');
  // The client's two schemes; anything else would fail later, inside the client, with less to go on.
  if (!/^esdb(\+discover)?:\/\/\S+$/.test(url)) throw new ConfigError('invalid environment variable EVENTSTORE_URL: not an esdb:// or esdb+discover:// connection string');
  return { eventLog: 'eventstoredb', eventStoreUrl: url };
}

/** Read only when SVC_HARVEST_TRANSPORT is kafka (harvestTransportFromEnv has checked KAFKA_BROKERS is there). */
function kafkaFromEnv(env: NodeJS.ProcessEnv): KafkaSettings | null {
  if (env.SVC_HARVEST_TRANSPORT !== 'kafka') return null;
  const brokers = (env.KAFKA_BROKERS ?? '').split(',').map((b) => b.trim()).filter(Boolean);
  const bad = brokers.find((b) => !/^\S+:\d{1,5}$/.test(b));
  if (brokers.length === 0 || bad !== undefined) throw new ConfigError(`invalid environment variable KAFKA_BROKERS: "${bad ?? env.KAFKA_BROKERS}" is not host:port`);
  let sasl: KafkaSettings['sasl'] = null;
  const mechanism = env.KAFKA_SASL_MECHANISM;
  if (mechanism) {
    if (mechanism !== 'plain' && mechanism !== 'scram-sha-256' && mechanism !== 'scram-sha-512') throw new ConfigError(`invalid environment variable KAFKA_SASL_MECHANISM: "${mechanism}" is not plain, scram-sha-256 or scram-sha-512`);
    const username = env.KAFKA_SASL_USERNAME;
    const password = env.KAFKA_SASL_PASSWORD;
    if (!username || !password) throw new ConfigError('KAFKA_SASL_MECHANISM needs KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD');
    sasl = { mechanism, username, password };
  }
  return {
    brokers,
    ssl: switchFromEnv(env, 'KAFKA_SSL', false),
    sasl,
    // the transport's own defaults (src/dispatch/kafka.ts), named here so that every process reads the same
    topicPrefix: env.SVC_KAFKA_TOPIC_PREFIX || 'svc.dispatch.',
    groupPrefix: env.SVC_KAFKA_GROUP_PREFIX || 'svc.dispatch.',
    partitions: intFromEnv(env, 'SVC_KAFKA_PARTITIONS', 8, 1, 10_000),
    // the brokers' group.min/max.session.timeout.ms bound it further (6 s to 30 min by default)
    sessionTimeoutMs: intFromEnv(env, 'SVC_KAFKA_SESSION_TIMEOUT_MS', 30_000, 1_000, 3_600_000),
  };
}

export function loadSettings(env: NodeJS.ProcessEnv = process.env, overrides: Partial<Settings> = {}): Settings {
  const configPath = overrides.configPath !== undefined ? overrides.configPath : env.SVC_CONFIG || null;
  const models = overrides.models ?? loadServiceConfig(configPath).models;
  return {
    port: intFromEnv(env, 'PORT', 8080, 0, 65535),
    host: env.HOST || '127.0.0.1',
    dataDir: resolve(env.DATA_DIR || './data'),
    databaseUrl: env.DATABASE_URL || null,
    ...eventLogFromEnv(env),
    requestWindowMs: intFromEnv(env, 'SVC_REQUEST_WINDOW_MS', 14 * 60 * 1000, 1, 24 * 3600 * 1000),
    deadlineTokensPerSecond: 20,
    logLevel: env.LOG_LEVEL || 'info',
    breaker: {
      failureThreshold: intFromEnv(env, 'SVC_BREAKER_FAILURE_THRESHOLD', 5, 1, 1_000_000),
      cooldownMs: intFromEnv(env, 'SVC_BREAKER_COOLDOWN_MS', 60_000, 0, 24 * 3600 * 1000),
      probeLeaseMs: intFromEnv(env, 'SVC_BREAKER_PROBE_LEASE_MS', 30_000, 1, 24 * 3600 * 1000),
    },
    shutdownGraceMs: intFromEnv(env, 'SVC_SHUTDOWN_GRACE_MS', 60_000, 0, 3600_000),
    http: httpTimeoutsFromEnv(env),
    authFailures: {
      limit: intFromEnv(env, 'SVC_AUTH_FAILURE_LIMIT', 30, 0, 1_000_000),
      windowMs: intFromEnv(env, 'SVC_AUTH_FAILURE_WINDOW_MS', 60_000, 1000, 24 * 3600 * 1000),
    },
    trustedProxies: (env.SVC_TRUSTED_PROXIES ?? '').split(',').map((s) => s.trim()).filter((s) => s.length > 0),
    metering: switchFromEnv(env, 'SVC_METERING', true),
    projections: switchFromEnv(env, 'SVC_PROJECTIONS', true),
    processorLeaseMs: intFromEnv(env, 'SVC_PROCESSOR_LEASE_MS', 3000, 300, 600_000),
    reservationTtlMs: intFromEnv(env, 'SVC_RESERVATION_TTL_MS', 20 * 60 * 1000, 100, 7 * 24 * 3600 * 1000),
    slotLeaseTtlMs: intFromEnv(env, 'SVC_SLOT_LEASE_MS', 60_000, 100, 3600_000),
    dailySpendCap: numberFromEnv(env, 'SVC_DAILY_SPEND_CAP'),
    engines: {
      warmAtStart: switchFromEnv(env, 'SVC_ENGINE_WARM_AT_START', false),
      idleMs: intFromEnv(env, 'SVC_ENGINE_IDLE_MS', 15 * 60 * 1000, 0, 7 * 24 * 3600 * 1000),
      ackTimeoutMs: intFromEnv(env, 'SVC_COLD_BOOT_ACK_TIMEOUT_MS', 30_000, 1, 3600_000),
      graceMs: intFromEnv(env, 'SVC_COLD_BOOT_GRACE_MS', 1_000, 0, 3600_000),
      keepaliveMs: intFromEnv(env, 'SVC_COLD_BOOT_KEEPALIVE_MS', 5_000, 1, 3600_000),
      bootDeadlineMs: intFromEnv(env, 'SVC_COLD_BOOT_DEADLINE_MS', 14 * 60 * 1000, 1, 24 * 3600 * 1000),
    },
    harvest: {
      storageDir: resolve(env.SVC_HARVEST_DIR || join(env.DATA_DIR || './data', 'harvest')),
      maxBodyBytes: intFromEnv(env, 'SVC_HARVEST_MAX_BODY_BYTES', 50 * 1024 * 1024, 1, 2 ** 31 - 1),
      maxPrompts: intFromEnv(env, 'SVC_HARVEST_MAX_PROMPTS', 4096, 1, 10_000_000),
      maxEstimatedTokens: intFromEnv(env, 'SVC_HARVEST_MAX_ESTIMATED_TOKENS', 2_000_000, 1, 2 ** 31 - 1),
      maxRunningPerKey: intFromEnv(env, 'SVC_HARVEST_MAX_RUNNING_PER_KEY', 3, 1, 1_000_000),
      staleAfterMs: intFromEnv(env, 'SVC_HARVEST_STALE_MINUTES', 180, 1, 7 * 24 * 60) * 60_000,
      failedRetentionMs: intFromEnv(env, 'SVC_HARVEST_FAILED_RETENTION_HOURS', 72, 0, 24 * 365) * 3_600_000,
      defaultBatchSize: intFromEnv(env, 'SVC_HARVEST_DEFAULT_BATCH_SIZE', 8, 1, 64),
      transport: harvestTransportFromEnv(env),
      kafka: kafkaFromEnv(env),
      workers: intFromEnv(env, 'SVC_HARVEST_WORKERS', 1, 0, 64),
      leaseMs: intFromEnv(env, 'SVC_HARVEST_LEASE_MS', 30_000, 100, 3600_000),
      maxRedispatches: intFromEnv(env, 'SVC_HARVEST_MAX_REDISPATCHES', 5, 1, 1000),
      longPollsPerKey: intFromEnv(env, 'SVC_HARVEST_LONGPOLLS_PER_KEY', 4, 0, 100_000),
      longPollsTotal: intFromEnv(env, 'SVC_HARVEST_LONGPOLLS_TOTAL', 8, 0, 1_000_000),
    },
    ...overrides,
    configPath,
    models,
  };
}

/** SVC_HTTP_HEADERS_TIMEOUT_MS and SVC_HTTP_REQUEST_TIMEOUT_MS; the headers' bound may not exceed the request's. */
function httpTimeoutsFromEnv(env: NodeJS.ProcessEnv): Settings['http'] {
  const requestTimeoutMs = intFromEnv(env, 'SVC_HTTP_REQUEST_TIMEOUT_MS', 300_000, 100, 3600_000);
  const headersTimeoutMs = intFromEnv(env, 'SVC_HTTP_HEADERS_TIMEOUT_MS', Math.min(30_000, requestTimeoutMs), 100, 3600_000);
  if (headersTimeoutMs > requestTimeoutMs) {
    throw new ConfigError(`SVC_HTTP_HEADERS_TIMEOUT_MS (${headersTimeoutMs}) must not exceed SVC_HTTP_REQUEST_TIMEOUT_MS (${requestTimeoutMs})`);
  }
  return { headersTimeoutMs, requestTimeoutMs };
}

/**
 * The admin token: SVC_ADMIN_TOKEN when set; otherwise generated on first start and kept under DATA_DIR
 * readable by the owner only. `created` tells the caller to print it (once).
 */
export function resolveAdminToken(env: NodeJS.ProcessEnv, dataDir: string): { token: string; created: boolean } {
  if (env.SVC_ADMIN_TOKEN) return { token: env.SVC_ADMIN_TOKEN, created: false };
  const file = join(dataDir, 'admin-token');
  if (existsSync(file)) return { token: readFileSync(file, 'utf8').trim(), created: false };
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const token = `svc_admin_${randomBytes(24).toString('base64url')}`;
  writeFileSync(file, `${token}\n`, { mode: 0o600, flag: 'wx' });
  chmodSync(file, 0o600);
  return { token, created: true };
}

/** A password kept owner-only in `file` under DATA_DIR, generated when `create` and missing; null when none. */
function keptPassword(dataDir: string, name: string, create: boolean): { password: string; created: boolean } | null {
  const file = join(dataDir, name);
  if (existsSync(file)) return { password: readFileSync(file, 'utf8').trim(), created: false };
  if (!create) return null;
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  const password = randomBytes(24).toString('base64url');
  writeFileSync(file, `${password}\n`, { mode: 0o600, flag: 'wx' });
  chmodSync(file, 0o600);
  return { password, created: true };
}

/**
 * The embedded store's SQL port passwords. Analysts': SVC_SQL_PASSWORD when set, otherwise
 * DATA_DIR/sql-password; `created` tells `svc serve` to print it (once). The owner's (user `svc`, what
 * the CLI's read-only commands use, every column): DATA_DIR/sql-owner-password, never printed. Both
 * generated owner-only when `create` and missing; null when there are none and none were to be made.
 */
export function resolveSqlPasswords(env: NodeJS.ProcessEnv, dataDir: string, create: boolean): { analyst: string; owner: string; created: boolean } | null {
  const analyst = env.SVC_SQL_PASSWORD ? { password: env.SVC_SQL_PASSWORD, created: false } : keptPassword(dataDir, 'sql-password', create);
  const owner = keptPassword(dataDir, 'sql-owner-password', create);
  if (!analyst || !owner) return null;
  return { analyst: analyst.password, owner: owner.password, created: analyst.created };
}
