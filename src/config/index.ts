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
  configPath: string | null;
  models: ModelConfig[];
  /** Non-streaming request window; the contract's 14 minutes, shorter only in tests. */
  requestWindowMs: number;
  /** Tokens per second the deadline feasibility check assumes. */
  deadlineTokensPerSecond: number;
  logLevel: string;
  /** How long a shutdown waits for in-flight requests before closing their connections. */
  shutdownGraceMs: number;
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
  });
  const defaults = config.models.filter((m) => m.default === true);
  if (defaults.length !== 1) {
    throw new ConfigError(`invalid configuration in ${source}: field models[].default must be true on exactly one model (found ${defaults.length})`);
  }
  if (defaults[0].status === 'staging') {
    throw new ConfigError(`invalid configuration in ${source}: field models[].default names staging model "${defaults[0].id}"`);
  }
  return config;
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

export function loadSettings(env: NodeJS.ProcessEnv = process.env, overrides: Partial<Settings> = {}): Settings {
  const configPath = overrides.configPath !== undefined ? overrides.configPath : env.SVC_CONFIG || null;
  const models = overrides.models ?? loadServiceConfig(configPath).models;
  return {
    port: intFromEnv(env, 'PORT', 8080, 0, 65535),
    host: env.HOST || '127.0.0.1',
    dataDir: resolve(env.DATA_DIR || './data'),
    databaseUrl: env.DATABASE_URL || null,
    requestWindowMs: intFromEnv(env, 'SVC_REQUEST_WINDOW_MS', 14 * 60 * 1000, 1, 24 * 3600 * 1000),
    deadlineTokensPerSecond: 20,
    logLevel: env.LOG_LEVEL || 'info',
    shutdownGraceMs: intFromEnv(env, 'SVC_SHUTDOWN_GRACE_MS', 60_000, 0, 3600_000),
    ...overrides,
    configPath,
    models,
  };
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
