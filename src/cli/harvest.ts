/**
 * `svc harvest submit|watch|download`: a researcher's client for bulk activation harvests, over HTTP
 * (SVC_URL, default http://127.0.0.1:8080) with their API key (SVC_API_KEY).
 */
import { createHash } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { Readable, Transform } from 'node:stream';
import { pipeline } from 'node:stream/promises';
import { serializeManifest } from '../harvest/manifest.ts';
import type { HarvestShardView } from '../harvest/types.ts';
import { parseArgs, UsageError } from './args.ts';

export const harvestUsage = `usage: svc harvest <command>

  submit FILE [--model ID] [--layers all|0,3,5] [--shard-size N] [--batch-size N] [--json]
        FILE: a JSON harvest request ({"model", "prompts", ...}), a JSON array of prompts, or
        text with one prompt per line ("-": standard input); flags override the file's fields.
        Prints the job id (--json: the job).
  watch JOB_ID [--json]      a progress bar until the job ends, with prompts/s; exit 0 when it succeeded
  download JOB_ID DIR        every shard and manifest.json into DIR, each shard's SHA-256 verified

environment: SVC_URL (http://127.0.0.1:8080), SVC_API_KEY (required)`;

export interface HarvestIo {
  env: NodeJS.ProcessEnv;
  stdout: NodeJS.WritableStream & { isTTY?: boolean };
  stderr: NodeJS.WritableStream;
  stdin?: NodeJS.ReadableStream;
}

class CliError extends Error {}

interface Client {
  base: string;
  request(method: string, path: string, body?: unknown, timeoutMs?: number): Promise<any>;
  fetch(path: string): Promise<Response>;
}

function client(io: HarvestIo): Client {
  const base = (io.env.SVC_URL || 'http://127.0.0.1:8080').replace(/\/+$/, '');
  const key = io.env.SVC_API_KEY;
  if (!key) throw new CliError('SVC_API_KEY is not set: export your API key (svc_<prefix>_<secret>)');
  const headers = { authorization: `Bearer ${key}` };
  const send = async (path: string, init: RequestInit): Promise<Response> => {
    try {
      return await fetch(`${base}${path}`, { ...init, headers: { ...headers, ...(init.headers as Record<string, string>) } });
    } catch (err) {
      const cause = (err as { cause?: { code?: string; message?: string } }).cause;
      throw new CliError(`cannot reach the gateway at ${base} (${cause?.code ?? cause?.message ?? (err as Error).message}); set SVC_URL to point at it`);
    }
  };
  return {
    base,
    async request(method, path, body, timeoutMs = 90_000) {
      const res = await send(path, {
        method,
        headers: body === undefined ? {} : { 'content-type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(timeoutMs),
      });
      const text = await res.text();
      let parsed: any;
      try {
        parsed = JSON.parse(text);
      } catch {
        throw new CliError(`${base} answered ${res.status} with something that is not JSON; is SVC_URL a gateway?`);
      }
      if (!res.ok) throw new CliError(`${res.status} ${parsed?.error?.code ?? ''}: ${parsed?.error?.message ?? text}`);
      return parsed;
    },
    async fetch(path) {
      const res = await send(path, { method: 'GET' });
      if (!res.ok) {
        const text = await res.text();
        let message = text;
        try {
          const parsed = JSON.parse(text);
          message = `${parsed?.error?.code ?? ''}: ${parsed?.error?.message ?? text}`;
        } catch {
          /* not JSON */
        }
        throw new CliError(`${res.status} ${message}`);
      }
      return res;
    },
  };
}


async function readAll(stream: NodeJS.ReadableStream): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of stream) chunks.push(Buffer.from(chunk as Buffer));
  return Buffer.concat(chunks).toString('utf8');
}

/** The request from FILE: a whole request, a JSON array of prompts, or one prompt per line. */
export function harvestRequestFrom(text: string, flags: Map<string, string>): Record<string, unknown> {
  let request: Record<string, unknown>;
  const trimmed = text.trim();
  let parsed: unknown = undefined;
  if (trimmed.startsWith('{') || trimmed.startsWith('[')) {
    try {
      parsed = JSON.parse(trimmed);
    } catch {
      throw new UsageError('FILE looks like JSON but does not parse');
    }
  }
  if (Array.isArray(parsed)) request = { prompts: parsed };
  else if (parsed && typeof parsed === 'object') request = { ...(parsed as Record<string, unknown>) };
  else request = { prompts: text.split(/\r?\n/).filter((line) => line.length > 0) };
  for (const [flag, value] of flags) {
    switch (flag) {
      case '--model':
        request.model = value;
        break;
      case '--layers':
        request.layers = value === 'all' ? 'all' : value.split(',').map((v) => Number(v));
        break;
      case '--shard-size':
        request.shard_size = Number(value);
        break;
      case '--batch-size':
        request.batch_size = Number(value);
        break;
      default:
        throw new UsageError(`unknown option ${flag}`);
    }
  }
  if (request.model === undefined) throw new UsageError('no model: give --model ID or a "model" field in FILE');
  return request;
}

function bar(done: number, total: number, width = 30): string {
  const filled = total === 0 ? width : Math.round((done / total) * width);
  return `[${'#'.repeat(filled)}${'.'.repeat(width - filled)}]`;
}

async function watch(api: Client, jobId: string, io: HarvestIo, json: boolean): Promise<number> {
  const started = Date.now();
  let firstPrompts: number | null = null;
  for (;;) {
    const job = await api.request('GET', `/v1/harvest/${encodeURIComponent(jobId)}?wait=30`);
    const p = job.progress;
    if (firstPrompts === null) firstPrompts = p.prompts_done;
    const seconds = (Date.now() - started) / 1000;
    const rate = seconds > 0 ? (p.prompts_done - firstPrompts!) / seconds : 0;
    if (json) io.stdout.write(`${JSON.stringify(job)}\n`);
    else {
      const line = `${job.status.padEnd(9)} ${bar(p.prompts_done, p.prompts_total)} ${p.prompts_done}/${p.prompts_total} prompts, ${p.shards_done}/${p.shards_total} shards, ${rate.toFixed(1)} prompts/s`;
      io.stdout.write(io.stdout.isTTY ? `\r${line}` : `${line}\n`);
    }
    if (['succeeded', 'failed', 'cancelled'].includes(job.status)) {
      if (!json && io.stdout.isTTY) io.stdout.write('\n');
      if (job.status === 'failed' && job.error) io.stderr.write(`svc harvest: job failed: ${job.error.code}: ${job.error.message}\n`);
      return job.status === 'succeeded' ? 0 : 1;
    }
    if (job.status !== 'running' && job.status !== 'pending') return 1;
  }
}

async function download(api: Client, jobId: string, dir: string, io: HarvestIo): Promise<number> {
  const job = await api.request('GET', `/v1/harvest/${encodeURIComponent(jobId)}`);
  if (job.status !== 'succeeded' || !job.result) throw new CliError(`job ${jobId} is ${job.status}; only a succeeded job can be downloaded`);
  await mkdir(dir, { recursive: true });
  let bytes = 0;
  // Each file through a .partial file, checked against its SHA-256 before it takes its name.
  const fetchChecked = async (url: string, file: string, sha256: string) => {
    const res = await api.fetch(url);
    const target = join(dir, file);
    const partial = `${target}.partial`;
    const hash = createHash('sha256');
    const hashing = new Transform({
      transform(chunk, _encoding, callback) {
        hash.update(chunk);
        callback(null, chunk);
      },
    });
    await pipeline(Readable.fromWeb(res.body as any), hashing, createWriteStream(partial));
    const digest = hash.digest('hex');
    if (digest !== sha256) {
      await rm(partial, { force: true });
      throw new CliError(`${file}: SHA-256 ${digest} does not match the manifest's ${sha256}; nothing kept of it, run the download again`);
    }
    await rename(partial, target);
  };
  for (const shard of job.result.shards as HarvestShardView[]) {
    await fetchChecked(shard.url, shard.file, shard.sha256);
    bytes += shard.bytes;
    io.stdout.write(`${shard.file}  ${shard.bytes} bytes  sha256 ok\n`);
  }
  const stats = job.result.stats as { url: string; file: string; sha256: string; bytes: number } | null | undefined;
  if (stats) {
    await fetchChecked(stats.url, stats.file, stats.sha256);
    io.stdout.write(`${stats.file}  ${stats.bytes} bytes  sha256 ok\n`);
  }
  // The manifest last, byte for byte as the worker stored it (checked by its hash): its presence means every shard beside it is whole.
  const manifest = serializeManifest(job.result.manifest);
  const manifestSha = createHash('sha256').update(manifest).digest('hex');
  if (manifestSha !== job.result.manifest_sha256) throw new CliError(`manifest.json: SHA-256 ${manifestSha} does not match the job's ${job.result.manifest_sha256}`);
  await writeFile(join(dir, 'manifest.json'), manifest);
  io.stdout.write(`manifest.json  ${job.result.shards.length} shards, ${bytes} bytes in ${dir}\n`);
  return 0;
}

export async function harvestCommand(args: string[], io: HarvestIo = { env: process.env, stdout: process.stdout, stderr: process.stderr, stdin: process.stdin }): Promise<number> {
  const [command, ...rest] = args;
  try {
    const parsed = parseArgs(rest);
    switch (command) {
      case 'submit': {
        if (parsed.positional.length !== 1) throw new UsageError('svc harvest submit needs one FILE');
        const file = parsed.positional[0];
        const text = file === '-' ? await readAll(io.stdin ?? process.stdin) : await readFile(file, 'utf8').catch(() => {
          throw new CliError(`cannot read ${file}`);
        });
        const request = harvestRequestFrom(text, parsed.flags);
        const job = await client(io).request('POST', '/v1/harvest', request);
        io.stdout.write(parsed.json ? `${JSON.stringify(job)}\n` : `${job.id}\n`);
        return 0;
      }
      case 'watch': {
        if (parsed.positional.length !== 1 || parsed.flags.size > 0) throw new UsageError('svc harvest watch needs one JOB_ID');
        return await watch(client(io), parsed.positional[0], io, parsed.json);
      }
      case 'download': {
        if (parsed.positional.length !== 2 || parsed.flags.size > 0) throw new UsageError('svc harvest download needs JOB_ID and DIR');
        return await download(client(io), parsed.positional[0], parsed.positional[1], io);
      }
      default:
        throw new UsageError(command ? `unknown harvest command "${command}"` : 'a harvest command is needed');
    }
  } catch (err) {
    if (err instanceof UsageError) {
      io.stderr.write(`svc harvest: ${err.message}\n${harvestUsage}\n`);
      return 2;
    }
    if (err instanceof CliError) {
      io.stderr.write(`svc harvest: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
}
