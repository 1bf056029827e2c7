/**
 * Every fenced shell (`sh`, `bash`, `shell`) and TypeScript (`ts`, `typescript`) block of README.md,
 * then of each page of docs/ (in name order), runs in order against a started gateway, as a reader
 * would run it after `npm start`: from a directory that looks like the checkout after `npm ci` (`npx svc ...`
 * works there; `data` is the gateway's data directory, holding `admin-token` and, as `npm start`'s
 * does, the read-only SQL port's passwords and port for psql and `svc sql`), with `127.0.0.1:8080` /
 * `localhost:8080` pointed at the test's gateway (port 0). Shell blocks run with bash (-e, pipefail; curl fails on an HTTP error status through a
 * `.curlrc`), TypeScript blocks with `node --import tsx`; what one block exports (SVC_API_KEY) the
 * next ones see. A non-zero exit fails the block's test. Only blocks marked with an HTML comment
 * `<!-- not run: why -->` right before the fence are skipped, and they are listed.
 */
import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startTestGateway, type TestGateway } from '../support/gateway.ts';
import { markdownFiles, repo, runnableBlocks, type Snippet } from './markdown.ts';

function run(command: string, args: string[], options: { cwd: string; env: NodeJS.ProcessEnv; timeoutMs: number }): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd: options.cwd, env: options.env, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (chunk) => (output += chunk));
    child.stderr.on('data', (chunk) => (output += chunk));
    const timer = setTimeout(() => child.kill('SIGKILL'), options.timeoutMs);
    child.on('error', reject);
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, output });
    });
  });
}

/** The README first (its blocks make the key later blocks use), then docs/ in name order. */
const pages = ['README.md', ...markdownFiles().filter((f) => f.startsWith('docs/'))];
/** psql is PostgreSQL's client, installed with the server (infra/dev/services.sh): where it is missing, the blocks that call it are skipped and listed, as a marked block is. */
const psqlMissing = spawnSync('psql', ['--version'], { stdio: 'ignore' }).status !== 0;
const blocks: (Snippet & { page: string })[] = pages
  .flatMap((page) => runnableBlocks(readFileSync(join(repo, page), 'utf8')).map((b) => ({ ...b, page })))
  .map((b) => (psqlMissing && b.notRun === null && /(^|[\s;&|(])psql\b/m.test(b.code) ? { ...b, notRun: 'psql is not installed on this machine' } : b));
const snippets = blocks.filter((b) => b.page === 'README.md');

const it = suite<{ gateway: TestGateway; dir: string; env: NodeJS.ProcessEnv }>('runnable blocks of the README and docs/');

it.before(async (context) => {
  // As `npm start` runs it: the embedded store also served read-only on a loopback SQL port.
  context.gateway = await startTestGateway({}, { sqlPort: 0 });
  // A directory shaped like the checkout: the package (for `npx svc` and `import 'openai'`) and ./data, the gateway's.
  const dir = mkdtempSync(join(tmpdir(), 'svc-readme-'));
  for (const entry of ['package.json', 'bin', 'node_modules']) symlinkSync(join(repo, entry), join(dir, entry));
  symlinkSync(context.gateway.dataDir, join(dir, 'data'));
  writeFileSync(join(dir, 'data', 'admin-token'), `${context.gateway.adminToken}\n`, { mode: 0o600 });
  writeFileSync(join(dir, '.curlrc'), 'fail-with-body\nshow-error\n');
  writeFileSync(join(dir, 'exported.sh'), '');
  context.dir = dir;
  const env: NodeJS.ProcessEnv = { ...process.env, CURL_HOME: dir, SVC_URL: context.gateway.url, npm_config_update_notifier: 'false' };
  for (const name of ['DATA_DIR', 'SVC_ADMIN_TOKEN', 'SVC_API_KEY', 'SVC_SQL_PASSWORD', 'PGPASSWORD', 'PGUSER', 'PGDATABASE', 'PORT', 'HOST', 'DATABASE_URL', 'SVC_CONFIG']) delete env[name];
  context.env = env;
});

it.after(async (context) => {
  await context.gateway?.stop();
  if (context.dir) rmSync(context.dir, { recursive: true, force: true });
});

it('the README has shell and TypeScript blocks, and says how to call svc', () => {
  assert.ok(snippets.filter((s) => s.notRun === null && s.lang === 'shell').length >= 3);
  assert.ok(snippets.some((s) => s.notRun === null && s.lang === 'ts' && s.code.includes("from 'openai'")));
  assert.ok(snippets.some((s) => s.notRun === null && /\bnpx svc keys create\b/.test(s.code)));
  assert.not.ok(snippets.some((s) => /(^|[\s;&|(])svc keys\b/m.test(s.code.replace(/npx svc/g, ''))), 'a bare `svc` is not on PATH after npm ci');
});

const skipped = blocks.filter((s) => s.notRun !== null);
it(`blocks marked "not run" (skipped): ${skipped.map((s) => `${s.page}:${s.line} (${s.notRun})`).join('; ') || 'none'}`, () => {
  for (const s of skipped) assert.ok(s.notRun!.length > 0, `${s.page}:${s.line}: say why it is not run`);
});

for (const [n, snippet] of blocks.filter((s) => s.notRun === null).entries()) {
  it(`${snippet.page} line ${snippet.line}: ${snippet.lang} block ${snippet.index} runs`, async ({ gateway, dir, env }) => {
    const hostPort = new URL(gateway.url).host;
    const code = snippet.code.replace(/\b(127\.0\.0\.1|localhost):8080\b/g, hostPort);
    let script: string;
    if (snippet.lang === 'shell') {
      writeFileSync(join(dir, `block-${n}.sh`), `${code}\n`);
      script = `source ./exported.sh\nsource ./block-${n}.sh\nexport -p | grep -v '^declare -[a-zA-Z]*r' > ./exported.next && mv ./exported.next ./exported.sh\n`;
    } else {
      writeFileSync(join(dir, `block-${n}.ts`), `${code}\n`);
      script = `source ./exported.sh\nexec node --import tsx ./block-${n}.ts\n`;
    }
    // A bound for a hung block, not a speed target: the README's SQL block (six `npx svc` and psql calls) took over 90 s beside a CI run and two CPU-bound loops on 2 cores.
    const { code: exit, output } = await run('bash', ['-e', '-o', 'pipefail', '-c', script], { cwd: dir, env, timeoutMs: 300_000 });
    assert.is(exit, 0, `${snippet.page} line ${snippet.line} exited ${exit === null ? 'killed after 300 s' : exit}:\n${code}\n--- output ---\n${output}`);
  });
}

it.run();
